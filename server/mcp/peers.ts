/**
 * MCP sessions across the processes of one fleet. Every fleet worker serves `/mcp` on the shared listener
 * (node:cluster hands each new connection to one worker), but a session lives in the memory of the process that
 * opened it: its transport, its server and any elicitation it waits on. A client's next request may arrive on a
 * new connection, in another process. So a fleet worker's session id names its owner (`w2.<uuid>`: the worker
 * slot, then a random UUID), and a request naming another process's session is handed to that process whole:
 *
 *   arrived ──(path /mcp, mcp-session-id names another slot)──▶ connect to the owner's peer socket
 *   connect ok ──▶ the request's bytes go through unread (method, path, every header line, the body), the owner
 *                  answers it as if it had arrived there (authentication and the rate window counted once, there),
 *                  and its answer (an event stream included) comes back the same way
 *   connect refused (the owner exited: its sessions are gone) ──▶ answered here: authenticated, then 404
 *                  `not_found` like any unknown session, and the client initializes again
 *   the owner dies in the middle ──▶ the client's connection is cut, as if it had reached the owner directly
 *
 * Each worker's peer socket is a Unix socket in a folder only the service's user can open (mode 0700), one
 * path per slot, so a replacement worker takes its slot's path over. Only the peers connect there; what
 * arrives is routed through the very same fastify app (`app.routing`). The one thing a connection cannot carry
 * over is its TLS client certificate: the arriving worker adds the verified certificate's SHA-256 fingerprint
 * in {@link PEER_CERTIFICATE_HEADER} (a client's own header of that name is dropped first), and the owner takes
 * it only from its peer socket, as the TLS layer's own verdict. A session id names only a slot, and a session
 * is still its principal's alone (server/mcp/http.ts): guessing another slot gains nothing but a 404.
 */
import { randomUUID } from 'node:crypto';
import { chmodSync, unlinkSync } from 'node:fs';
import {
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from 'node:http';
import { connect, type Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';

/** The header that carries a forwarded request's verified client certificate fingerprint (peer socket only). */
export const PEER_CERTIFICATE_HEADER = 'x-actionledger-peer-certificate';

const TAG = /^w[1-9][0-9]{0,3}$/;
const SESSION = /^(w[1-9][0-9]{0,3})\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Where the other processes of the fleet take requests for the sessions they own. */
export interface McpPeers {
  /** This process's tag (`w<slot>`): the prefix of the session ids it mints. */
  self: string;
  /** The Unix socket path of the process tagged `tag` (this one's included). */
  socketPath(tag: string): string;
}

/** The tag of a fleet worker's slot. */
export function peerTag(slot: number): string {
  const tag = `w${slot}`;
  if (!TAG.test(tag)) throw new Error(`not a worker slot: ${slot}`);
  return tag;
}

/** A new session id: a UUID, prefixed with this process's tag in a fleet. */
export function newSessionId(tag: string | undefined): string {
  return tag === undefined ? randomUUID() : `${tag}.${randomUUID()}`;
}

/** The tag of the process that owns the session `id`, or null for an id no fleet worker minted. */
export function sessionOwner(id: string): string | null {
  return SESSION.exec(id)?.[1] ?? null;
}

/** The peer a request is for: another process's tag, when it is an `/mcp` request naming that one's session. */
function ownerElsewhere(req: IncomingMessage, peers: McpPeers): string | null {
  const path = (req.url ?? '').split('?')[0];
  if (path !== '/mcp') return null;
  const id = req.headers['mcp-session-id'];
  if (typeof id !== 'string') return null;
  const owner = sessionOwner(id);
  return owner === null || owner === peers.self ? null : owner;
}

/** Header lines a hop does not pass on: the connection's own, and the peer certificate a client may not set. */
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'upgrade', 'expect', PEER_CERTIFICATE_HEADER]);

function passedOn(raw: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i + 1 < raw.length; i += 2)
    if (!HOP.has((raw[i] ?? '').toLowerCase())) out.push(raw[i] ?? '', raw[i + 1] ?? '');
  return out;
}

/**
 * Wraps the listener's request handler: a request for another process's MCP session is forwarded to it (see
 * the file's comment), every other request goes to `local`. When the owner cannot be reached it goes to
 * `local` as well, which answers it as an unknown session.
 */
export function forwardingHandler(
  peers: McpPeers,
  local: (req: IncomingMessage, res: ServerResponse) => void,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const owner = ownerElsewhere(req, peers);
    if (owner === null) return local(req, res);
    const socket = connect(peers.socketPath(owner));
    const refused = (): void => {
      socket.destroy();
      local(req, res);
    };
    socket.once('error', refused);
    socket.once('connect', () => {
      socket.off('error', refused);
      forward(req, res, socket);
    });
  };
}

/** Sends `req` through `socket` (connected to its owner) and its owner's answer back through `res`. */
function forward(req: IncomingMessage, res: ServerResponse, socket: Socket): void {
  const headers = passedOn(req.rawHeaders);
  const tls = req.socket as Partial<TLSSocket>;
  if (tls.authorized === true && typeof tls.getPeerCertificate === 'function') {
    const fingerprint = tls.getPeerCertificate().fingerprint256;
    if (typeof fingerprint === 'string' && fingerprint !== '') headers.push(PEER_CERTIFICATE_HEADER, fingerprint);
  }
  headers.push('connection', 'close');
  const upstream = httpRequest({
    method: req.method,
    path: req.url,
    headers,
    createConnection: () => socket,
  });
  const cut = (): void => {
    upstream.destroy();
    socket.destroy();
    res.destroy();
  };
  upstream.once('error', cut);
  upstream.once('response', (answer) => {
    res.writeHead(answer.statusCode ?? 502, answer.statusMessage, passedOn(answer.rawHeaders));
    // Each chunk as it comes: an event stream is read as it is written.
    answer.on('data', (chunk: Buffer) => res.write(chunk));
    answer.once('end', () => res.end());
    answer.once('aborted', cut);
    answer.once('error', cut);
  });
  res.once('close', () => {
    if (!res.writableFinished) cut();
  });
  req.pipe(upstream);
}

/**
 * This process's peer socket: requests the other processes forward, handed to `route` (the fastify app's
 * routing) with the forwarded client certificate, if any, set on the connection as the TLS layer would.
 * Resolves once listening; the folder's mode keeps other users out (the socket itself is made 0600 too).
 */
export async function listenForPeers(
  path: string,
  route: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<Server> {
  try {
    unlinkSync(path); // the slot's previous worker, gone without removing it
  } catch {
    // none there
  }
  const server = createServer({ requireHostHeader: false }, (req, res) => {
    const fingerprint = req.headers[PEER_CERTIFICATE_HEADER];
    const socket = req.socket as Socket & { authorized?: boolean; getPeerCertificate?: () => object };
    socket.authorized = typeof fingerprint === 'string';
    socket.getPeerCertificate = () => (typeof fingerprint === 'string' ? { fingerprint256: fingerprint } : {});
    route(req, res);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => {
      server.off('error', reject);
      resolve();
    });
  });
  chmodSync(path, 0o600);
  return server;
}
