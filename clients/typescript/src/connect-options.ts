/**
 * What the Connect and gRPC-Web clients of both entry points share: their options and the
 * bearer-token interceptor. The service serves both protocols on its HTTP port
 * (`LANE_HTTP_LISTEN`), the same RPCs as on the gRPC port.
 */
import type { Interceptor } from "@connectrpc/connect";

/** The HTTP port's protocols: Connect (the default) or gRPC-Web. */
export type HttpProtocol = "connect" | "grpc-web";

/** Options of `createLaneConnectClient`, the same in Node and in browsers. */
export interface LaneConnectClientOptions {
  /** `"connect"` (default) or `"grpc-web"`. */
  protocol?: HttpProtocol;
  /** Sent as `authorization: Bearer <token>` with every call (services with auth on). A
   *  function is asked at every call, so a page can change the token without a new client. */
  token?: string | (() => string | undefined);
  /** Protobuf binary instead of JSON on the wire (Connect; gRPC-Web is always binary).
   *  Default true: smaller, and 64-bit integers need no string round trip. */
  binary?: boolean;
  /** More interceptors, run after the token's. */
  interceptors?: Interceptor[];
}

/** An interceptor that sends `token` (or what it returns) as a bearer token, when set. */
export function bearer(token: string | (() => string | undefined)): Interceptor {
  return (next) => (request) => {
    const value = typeof token === "function" ? token() : token;
    if (value) {
      request.header.set("authorization", `Bearer ${value}`);
    }
    return next(request);
  };
}

/** The interceptors of a client with `options`: the token's first. */
export function interceptorsOf(options: LaneConnectClientOptions): Interceptor[] {
  const token = options.token;
  return [...(token === undefined ? [] : [bearer(token)]), ...(options.interceptors ?? [])];
}
