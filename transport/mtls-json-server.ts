/**
 * The one mTLS JSON server of the repository, under the sandbox provider and authorizer and the gate's
 * authorization service: a node:https server that requires a client certificate from the given CA
 * (`requestCert`, `rejectUnauthorized: true`), with the service lifecycle the house style asks for
 * (`start()` / `stop()`, stop safe before start and safe to repeat), a bounded request body and JSON answers.
 *
 * `stop()` destroys every open socket, including ones a fault mode deliberately left hanging, and cancels the
 * timers it started, so a test's teardown never waits on a half-answered request.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { Service } from '../core/service.js';
import { extractContext, failSpan, SpanKind, startSpan, tracingOn, withSpan } from '../core/tracing.js';

/** The server's own certificate and key, and the CA(s) whose client certificates it accepts. */
export interface ServerTls {
  cert: string;
  key: string;
  ca: string | string[];
}

export interface ListenOptions {
  /** Address to listen on. Default 127.0.0.1 (loopback only). */
  host?: string;
  /** Port; default 0 (any free port). */
  port?: number;
  /** Host name used in `url`. Default 'localhost' (the sandbox certificates name it). */
  urlHost?: string;
}

export abstract class MtlsJsonServer extends Service {
  readonly #tls: ServerTls;
  readonly #listen: ListenOptions;
  readonly #sockets = new Set<Socket>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #server: Server | undefined;
  #port: number | undefined;

  protected constructor(tls: ServerTls, listen: ListenOptions = {}) {
    super();
    this.#tls = tls;
    this.#listen = listen;
  }

  /** `https://<urlHost>:<port>`, no trailing slash. Throws when the server is not started. */
  get url(): string {
    if (this.#port === undefined) throw new Error('server not started');
    return `https://${this.#listen.urlHost ?? 'localhost'}:${this.#port}`;
  }

  get port(): number {
    if (this.#port === undefined) throw new Error('server not started');
    return this.#port;
  }

  /** Listens; resolves once bound. */
  protected async onStart(): Promise<void> {
    const server = createServer(
      { ...this.#tls, requestCert: true, rejectUnauthorized: true, minVersion: 'TLSv1.2' },
      (req, res) => this.#dispatch(req, res),
    );
    server.on('connection', (socket: Socket) => {
      this.#sockets.add(socket);
      socket.once('close', () => this.#sockets.delete(socket));
    });
    server.on('tlsClientError', () => undefined); // a rejected handshake is a test case, not a crash
    this.#server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.#listen.port ?? 0, this.#listen.host ?? '127.0.0.1', () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.#port = (server.address() as { port: number }).port;
  }

  /** Closes the server and every open connection, cancels pending timers. */
  protected async onStop(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    this.#port = undefined;
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    for (const socket of this.#sockets) socket.destroy();
    this.#sockets.clear();
    if (server === undefined) return;
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Runs `fn` after `ms` unless the server stops first. */
  protected later(ms: number, fn: () => void): void {
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      fn();
    }, ms);
    this.#timers.add(timer);
  }

  protected abstract handle(req: IncomingMessage, res: ServerResponse): Promise<void>;

  /**
   * Answers a request whose {@link handle} threw: by default 500 `internal` (never a stack), or the
   * connection destroyed when the answer had already begun.
   */
  protected answerFailure(_err: unknown, res: ServerResponse): void {
    if (!res.headersSent) sendJson(res, 500, { error: 'internal' });
    else res.destroy();
  }

  #dispatch(req: IncomingMessage, res: ServerResponse): void {
    if (!tracingOn()) {
      this.handle(req, res).catch((err: unknown) => this.answerFailure(err, res));
      return;
    }
    // A SERVER span continuing the caller's `traceparent` (the dispatcher's authorization or provider request).
    // Named by the method and the server's kind, never the path: a readback path carries an effect key.
    const server = this.constructor.name;
    const parent = extractContext(req.headers);
    const span = startSpan(
      `${req.method ?? 'GET'} ${server}`,
      SpanKind.SERVER,
      () => ({
        'http.request.method': req.method ?? 'GET',
        'url.scheme': 'https',
        'server.port': this.#port ?? 0,
        'actionledger.server': server,
      }),
      { parent },
    );
    res.once('close', () => {
      span?.setAttribute('http.response.status_code', res.statusCode);
      if (res.statusCode >= 500) failSpan(span, String(res.statusCode));
      span?.end();
    });
    withSpan(span, () => this.handle(req, res), parent).catch((err: unknown) => this.answerFailure(err, res));
  }
}

/** Sends `value` as JSON (or `text` verbatim when a string is given) with Content-Length. */
export function sendJson(
  res: ServerResponse,
  status: number,
  value: unknown,
  headers: Record<string, string> = {},
): void {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': String(Buffer.byteLength(text)),
    ...headers,
  });
  res.end(text);
}

/** Reads the whole request body; null when it exceeds `maxBytes` (the rest is discarded). */
export async function readBody(req: IncomingMessage, maxBytes: number): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let total = 0;
  let tooBig = false;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    total += chunk.byteLength;
    if (total > maxBytes) tooBig = true;
    else chunks.push(chunk);
  }
  return tooBig ? null : Buffer.concat(chunks);
}

/** The verified client certificate's common name (the server only accepts verified ones). */
export function clientCommonName(req: IncomingMessage): string | undefined {
  const cn = (req.socket as TLSSocket).getPeerCertificate().subject?.CN;
  return typeof cn === 'string' ? cn : undefined;
}
