/**
 * Joining messages the service sent in parts (lane.v1.MessagePart).
 *
 * A WatchLaneResponse or DriveLaneResponse over the service's message limit (4 MiB) comes as
 * consecutive messages of the same type holding only `part`: the bytes of all parts joined are
 * the whole message's encoding, and every part but the last says it continues. A `PartJoiner`
 * takes a stream's messages one by one and hands back whole ones only, so a client folding the
 * stream never sees, let alone applies, part of an event group.
 */
import { fromBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { MessagePart } from "./gen/lane/v1/lane_service_pb.js";

/** The parts of a message broke the protocol: a message came between them, or they do not join. */
export class PartsError extends Error {
  override readonly name = "PartsError";
}

/** Joins the parts of one stream's messages of type `schema` (one joiner per stream). */
export class PartJoiner<Desc extends DescMessage> {
  private parts: Uint8Array[] = [];
  private size = 0;

  constructor(private readonly schema: Desc) {}

  /** Some parts arrived and the message's last part has not. */
  get pending(): boolean {
    return this.parts.length > 0;
  }

  /**
   * `message` itself when it is whole (`part` undefined); undefined for a part that continues;
   * the joined message for the last part. Throws `PartsError` when a whole message arrives while
   * parts wait, or when the parts do not decode.
   */
  take(message: MessageShape<Desc>, part: MessagePart | undefined): MessageShape<Desc> | undefined {
    const name = this.schema.name;
    if (part === undefined) {
      if (this.pending) {
        throw new PartsError(`a whole ${name} arrived between the parts of another`);
      }
      return message;
    }
    if (part.data.length === 0) {
      throw new PartsError(`an empty part of a ${name}`);
    }
    this.parts.push(part.data);
    this.size += part.data.length;
    if (part.continues) {
      return undefined;
    }
    const joined = new Uint8Array(this.size);
    let at = 0;
    for (const piece of this.parts) {
      joined.set(piece, at);
      at += piece.length;
    }
    this.parts = [];
    this.size = 0;
    try {
      return fromBinary(this.schema, joined);
    } catch (thrown) {
      throw new PartsError(`the parts of a ${name} do not decode: ${String(thrown)}`);
    }
  }
}
