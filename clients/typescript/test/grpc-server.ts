/**
 * An in-process connect-node gRPC server (HTTP/2, the gRPC protocol only) for the tests that
 * need the real transport: it listens on a free local port and keeps its HTTP/2 sessions, so a
 * test can tear a connection down, and so stopping it can close connections clients keep open.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

export interface GrpcServer {
  /** `127.0.0.1:port`. */
  readonly address: string;
  /** The open HTTP/2 sessions, oldest first. */
  readonly sessions: Set<http2.ServerHttp2Session>;
  /** Destroy every session (clients keep theirs open) and close the server. */
  stop(): Promise<void>;
}

/** Serve `routes` until `stop()`. */
export async function startGrpcServer(routes: (router: ConnectRouter) => void): Promise<GrpcServer> {
  const server = http2.createServer(
    connectNodeAdapter({ routes, grpc: true, connect: false, grpcWeb: false }),
  );
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    sessions,
    async stop() {
      for (const session of sessions) {
        session.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
