/**
 * A LaneService client over Connect or gRPC-Web for Node (connect-node), for the service's
 * HTTP port. The browser entry's `createLaneConnectClient` (`connect-client-web.ts`) takes the
 * same options, so code written against it runs in both.
 */
import { createClient } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcWebTransport,
  type ConnectTransportOptions,
} from "@connectrpc/connect-node";
import type { LaneServiceClient } from "./lane-client.js";
import { interceptorsOf, type LaneConnectClientOptions } from "./connect-options.js";
import { LaneService } from "./gen/lane/v1/lane_service_pb.js";
import { nameEndpoint } from "./reach.js";

/** Options of the Node `createLaneConnectClient`: the shared ones, plus the HTTP version. */
export type LaneConnectNodeOptions = LaneConnectClientOptions &
  Partial<Pick<ConnectTransportOptions, "httpVersion">>;

/**
 * A client for the HTTP port at `baseUrl` (`http://host:port` or `https://…`). HTTP/1.1 by
 * default, which every proxy passes; `httpVersion: "2"` for HTTP/2 (cleartext: prior knowledge).
 */
export function createLaneConnectClient(
  baseUrl: string,
  options: LaneConnectNodeOptions = {},
): LaneServiceClient {
  const common = {
    baseUrl,
    httpVersion: options.httpVersion ?? "1.1",
    interceptors: interceptorsOf(options),
    useBinaryFormat: options.binary ?? true,
  };
  const transport =
    options.protocol === "grpc-web" ? createGrpcWebTransport(common) : createConnectTransport(common);
  return nameEndpoint(createClient(LaneService, transport), {
    target: baseUrl,
    token: options.token !== undefined,
  });
}
