/**
 * A LaneService client over Connect or gRPC-Web for browsers (connect-web, on `fetch`), for the
 * service's HTTP port. It also runs wherever `fetch` streams responses (Node 20 and later).
 */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import { interceptorsOf, type LaneConnectClientOptions } from "./connect-options.js";
import { LaneService } from "./gen/lane/v1/lane_service_pb.js";
import { nameEndpoint } from "./reach.js";
import type { LaneServiceClient } from "./lane-client.js";

/**
 * A client for the HTTP port at `baseUrl`: an absolute URL, or a path such as `"/"` for the
 * page's own origin (the service's web view does that).
 */
export function createLaneConnectClient(
  baseUrl: string,
  options: LaneConnectClientOptions = {},
): LaneServiceClient {
  const common = {
    baseUrl,
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
