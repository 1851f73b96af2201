"""Hand-written Python client of the lane service: the snapshot reducer and friends."""
