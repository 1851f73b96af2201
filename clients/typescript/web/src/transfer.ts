/**
 * A lane out as a file and back in: ExportLane's pieces joined into a download, and an export
 * file uploaded to the HTTP port's ImportLane upload path (a browser cannot send ImportLane's
 * client stream; the service feeds the upload to the same handler: docs/web-console.md).
 */
import { fromBinary } from "@bufbuild/protobuf";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { Code } from "@connectrpc/connect";
import { ErrorInfoSchema, LaneError, type LaneServiceClient } from "@lane/client";
import { BASE_URL, authorization } from "./session.js";

/** Where the service takes an export file to import (service/lane/server/api/http_import.py). */
export const UPLOAD_PATH = "upload/lane.v1.LaneService/ImportLane";

/** The lane's export file (JSON Lines), read whole. */
export async function exportFile(client: LaneServiceClient, laneId: string, signal?: AbortSignal): Promise<Blob> {
  const pieces: Uint8Array[] = [];
  for await (const piece of client.exportLane({ laneId }, { signal })) {
    pieces.push(piece.data);
  }
  return new Blob(pieces as BlobPart[], { type: "application/jsonl" });
}

/** Offer `blob` to the user as the file `name`. */
export function download(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** What ImportLane answers. */
export interface Imported {
  readonly laneId: string;
  readonly revision: string;
  readonly entryCount?: string;
  readonly eventCount?: string;
}

/** Import `file` as the new lane `laneId`; a refusal is thrown as the LaneError it is. */
export async function importFile(file: Blob, laneId: string, signal?: AbortSignal): Promise<Imported> {
  const url = new URL(`${UPLOAD_PATH}?${new URLSearchParams({ lane_id: laneId })}`, BASE_URL);
  let response: Response;
  try {
    response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/octet-stream", ...authorization() },
      body: file,
      signal,
    });
  } catch (thrown) {
    throw new LaneError({ code: Code.Unavailable, message: `the upload failed: ${String(thrown)}` });
  }
  const text = await response.text();
  if (response.ok) {
    return JSON.parse(text) as Imported;
  }
  throw refusalOf(text, response.status);
}

/** The LaneError of a Connect error body (`{"code", "message", "details"}`). */
export function refusalOf(text: string, status: number): LaneError {
  let body: { code?: string; message?: string; details?: { type?: string; value?: string }[] } = {};
  try {
    body = JSON.parse(text) as typeof body;
  } catch {
    return new LaneError({ code: Code.Unknown, message: `HTTP ${status}: ${text.slice(0, 200)}` });
  }
  const name = (body.code ?? "unknown")
    .split("_")
    .map((part) => part.charAt(0).toUpperCase() + part.slice(1))
    .join("");
  const code = (Code as unknown as Record<string, Code>)[name] ?? Code.Unknown;
  const detail = (body.details ?? []).find((d) => d.type === "google.rpc.ErrorInfo");
  const info = detail?.value === undefined ? undefined : fromBinary(ErrorInfoSchema, base64Decode(detail.value));
  return new LaneError({
    code,
    message: body.message ?? "",
    reason: info?.reason ?? "",
    domain: info?.domain ?? "",
    metadata: info?.metadata ?? {},
  });
}

/** The lane id an export file names in its first line (its header), if it can be read. */
export async function exportedLaneId(file: Blob): Promise<string | undefined> {
  const head = await file.slice(0, 64 * 1024).text();
  try {
    const header = JSON.parse(head.split("\n", 1)[0] ?? "") as { laneId?: unknown };
    return typeof header.laneId === "string" ? header.laneId : undefined;
  } catch {
    return undefined;
  }
}
