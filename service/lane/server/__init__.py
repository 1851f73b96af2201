"""The lane service: contracts → domain → store → hub → api → app."""
