/**
 * Watching for the moment undici has written one request to its socket (the diagnostics channel
 * `undici:request:bodySent`), for crash points that must fire after a request left and before its answer.
 */
import { subscribe, unsubscribe } from 'node:diagnostics_channel';

/** One outgoing request, recognised by its URL (origin + path + query) and the value of one of its headers. */
export interface SentRequestMatch {
  url: string;
  headerName: string;
  headerValue: string;
}

interface UndiciRequestMessage {
  request?: { origin?: unknown; path?: unknown; headers?: unknown };
}

function matchesRequest(message: unknown, origin: string, path: string, name: string, value: string): boolean {
  const req = (message as UndiciRequestMessage | null)?.request;
  if (req === undefined || req.origin !== origin || req.path !== path || !Array.isArray(req.headers)) return false;
  // undici keeps headers as a flat [name, value, name, value, ...] list, names as the caller spelled them.
  const headers = req.headers as unknown[];
  for (let i = 0; i + 1 < headers.length; i += 2) {
    const n = headers[i];
    if (typeof n === 'string' && n.toLowerCase() === name && headers[i + 1] === value) return true;
  }
  return false;
}

/**
 * Calls `fn` (at most once) at the moment undici has written a request matching `match` to its socket: the
 * request line, the headers and the whole body handed to `socket.write` (diagnostics channel
 * `undici:request:bodySent`, published synchronously right after the writes). Returns a function that stops
 * watching; call it when the request has settled. Nothing is published for a request that failed before it
 * was written (connect or TLS failure, `not_sent`), so `fn` is not called then.
 *
 * Limits: "written" means handed to `socket.write`, not acknowledged by the peer. A small request on a
 * connection with room in the kernel's send buffer is in the kernel by then (a SIGKILL does not stop its
 * delivery); a large one, or one behind a full buffer, may still wait in Node's write queue and die with the
 * process. Requests are told apart by URL and one header value (the Idempotency-Key, unique per operation):
 * two concurrent requests with the same URL and value in one process are indistinguishable, and the first
 * one written fires.
 */
export function onRequestSent(match: SentRequestMatch, fn: () => void): () => void {
  let target: URL;
  try {
    target = new URL(match.url);
  } catch {
    return () => undefined; // not a URL: undici could not have sent it either
  }
  const origin = target.origin;
  const path = `${target.pathname}${target.search}`;
  const name = match.headerName.toLowerCase();
  let done = false;
  const listener = (message: unknown): void => {
    if (done || !matchesRequest(message, origin, path, name, match.headerValue)) return;
    done = true;
    fn();
  };
  subscribe('undici:request:bodySent', listener);
  return () => {
    done = true;
    unsubscribe('undici:request:bodySent', listener);
  };
}
