/**
 * The outbound mTLS HTTPS client (the authorizer, providers and their readback), on undici 7.
 *
 * Every call returns a classified outcome instead of throwing, grouped by what must happen next:
 * - `response`: a complete, strictly parsed JSON object (or an empty body) arrived with a non-3xx status.
 * - `not_sent`: provably no byte of the request reached the peer's HTTP layer: refused connection, DNS, connect
 *   timeout, any failure of the TCP connect or TLS handshake (server certificate from another CA, wrong host
 *   name, expired certificate, our client certificate rejected), an invalid request, or a signal that was
 *   already aborted. Safe to retry with the same Idempotency-Key.
 * - `unknown`: the request may have been processed: timeout after the connection was handed to undici, reset
 *   mid-exchange, oversized or malformed body, a redirect. Goes to the reconciler.
 *
 * How "before send" is known: the TLS connector is wrapped, and every error it reports (the socket does not
 * exist for undici yet, so no request byte was written on it) is remembered in a WeakSet. Errors are then
 * classified by that phase and by `err.code`, never by message text.
 *
 * TLS 1.3 client certificates: the client finishes its handshake before the server has checked the client
 * certificate, so a rejection would arrive after the request was written and look like a plain reset. The
 * connector therefore waits, after the handshake, for the server's first session ticket (OpenSSL, Go, nginx
 * and Node send one only after accepting the client's Finished message and certificate) or for at most
 * `handshakeConfirmMs`. A close or alert in that window is a connect-phase failure (`not_sent`, `tls`).
 * Limit: against a server that sends no tickets, the wait expires and a later rejection is classified by its
 * code: a certificate alert is `not_sent`, a bare close is `unknown`.
 *
 * What this client never does: use the global dispatcher or proxy environment variables, follow redirects,
 * turn TLS verification off, or read more than `maxBytes` of a body.
 */
import { createHash } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import type { LookupFunction, Socket } from 'node:net';
import { createRequire } from 'node:module';
import type { Agent, buildConnector } from 'undici';
import { ActionLedgerError, isActionLedgerError } from '../core/errors.js';
import { parseStrictJson, type JsonObject } from '../core/json.js';
import { Secret } from '../core/secret.js';
import {
  errorType,
  failSpan,
  injectContext,
  SpanKind,
  startSpan,
  tracingOn,
  withSpan,
  type Attributes,
} from '../core/tracing.js';

export interface MtlsAgentOptions {
  /** PEM trust anchors for the server certificate. Omitted: Node's bundled public roots. */
  ca?: string | string[];
  /** PEM client certificate; with `key`, presented for mutual TLS. */
  cert?: string;
  key?: string | Buffer | Secret;
  /** Name for SNI and host-name verification instead of the URL's host. */
  servername?: string;
  /** Bound on TCP connect plus TLS handshake (and the TLS 1.3 confirmation wait); keep it below `timeoutMs`. */
  connectTimeoutMs: number;
  /** TLS 1.3 wait for the server's acceptance of the client certificate (see the file comment). Default 200; 0 skips. */
  handshakeConfirmMs?: number;
  /**
   * Resolves the host names connected to instead of `dns.lookup` (given to `tls.connect`, so the address it
   * returns is the one connected to): transport/network-target.ts's `guardedLookup` refuses internal addresses.
   */
  lookup?: LookupFunction;
}

export interface RequestOptions {
  headers?: Record<string, string>;
  /** What the request is, for its span's name (`POST authorize`) while tracing is on. */
  spanName?: string;
  /**
   * The URL as configured, placeholders unexpanded (`https://p.example/v1/refunds/by-key/{effect_key}`), that
   * the span records as `url.template` while tracing is on. Without it the span records the scheme, host and port
   * only: a path may carry an effect key or a webhook's capability token, and is never recorded.
   */
  urlTemplate?: string;
  /** Whole-request bound: connect, send, headers and body. */
  timeoutMs: number;
  /** Largest response body read; more is `unknown` / `oversized`. */
  maxBytes: number;
  /** Caller's cancellation (the external-write scope, shutdown). */
  signal?: AbortSignal;
}

export type NotSentCode =
  'refused' | 'dns' | 'connect_timeout' | 'tls' | 'connect_failed' | 'invalid_request' | 'aborted';
export type UnknownCode =
  'timeout' | 'reset' | 'oversized' | 'malformed_json' | 'redirect' | 'protocol' | 'aborted' | 'error';

export interface HttpResponse {
  kind: 'response';
  status: number;
  /** Lower-case names; repeated headers joined with ", ". */
  headers: Record<string, string>;
  /** The body as one strictly parsed JSON object; null when the body was empty (0 bytes). */
  json: JsonObject | null;
  /** Lower-case hex SHA-256 of the raw body bytes. */
  bodySha256: string;
}
export interface HttpNotSent {
  kind: 'not_sent';
  code: NotSentCode;
  /** The underlying `err.code` (ECONNREFUSED, CERT_HAS_EXPIRED, ...), for logs and metrics. */
  errorCode?: string;
  cause?: unknown;
}
export interface HttpUnknown {
  kind: 'unknown';
  code: UnknownCode;
  errorCode?: string;
  /** Set when a status line arrived (oversized, malformed_json, redirect, body reset). */
  status?: number;
  /** For `redirect`: the Location header, reported and never followed. */
  location?: string;
  cause?: unknown;
}
export type HttpOutcome = HttpResponse | HttpNotSent | HttpUnknown;

/** Errors raised while connecting (TCP + TLS): the request was never written. */
const connectPhase = new WeakSet<object>();

const TLS_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'CERT_SIGNATURE_FAILURE',
  'INVALID_CA',
  'INVALID_PURPOSE',
  'HOSTNAME_MISMATCH',
  'ERR_TLS_CERT_ALTNAME_INVALID',
  'ERR_TLS_HANDSHAKE_REJECTED',
]);
/** Alerts a server's TLS layer sends when it refuses our certificate: its HTTP layer never saw the request. */
const CLIENT_CERT_ALERTS = new Set([
  'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED',
  'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_UNKNOWN',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_REVOKED',
  'ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE',
  'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA',
]);
const RESET_CODES = new Set([
  'ECONNRESET',
  'EPIPE',
  'ECONNABORTED',
  'UND_ERR_SOCKET',
  'UND_ERR_RES_CONTENT_LENGTH_MISMATCH',
]);
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']);

function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

function notSent(code: NotSentCode, cause?: unknown): HttpNotSent {
  const out: HttpNotSent = { kind: 'not_sent', code };
  const ec = errorCode(cause);
  if (ec !== undefined) out.errorCode = ec;
  if (cause !== undefined) out.cause = cause;
  return out;
}

function unknown(code: UnknownCode, cause?: unknown, status?: number): HttpUnknown {
  const out: HttpUnknown = { kind: 'unknown', code };
  const ec = errorCode(cause);
  if (ec !== undefined) out.errorCode = ec;
  if (cause !== undefined) out.cause = cause;
  if (status !== undefined) out.status = status;
  return out;
}

function classifyConnectError(err: unknown): HttpNotSent {
  const code = errorCode(err) ?? '';
  if (code === 'ECONNREFUSED') return notSent('refused', err);
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return notSent('dns', err);
  if (code === 'UND_ERR_CONNECT_TIMEOUT') return notSent('connect_timeout', err);
  if (TLS_CODES.has(code) || code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_')) return notSent('tls', err);
  return notSent('connect_failed', err);
}

/** Classifies an error from undici. `afterHeaders`: a status line had arrived, so nothing is "not sent". */
function classifyError(err: unknown, afterHeaders: boolean, status?: number): HttpOutcome {
  if (!afterHeaders && err !== null && typeof err === 'object' && connectPhase.has(err))
    return classifyConnectError(err);
  const code = errorCode(err) ?? '';
  if (!afterHeaders && CLIENT_CERT_ALERTS.has(code)) return notSent('tls', err);
  if (!afterHeaders && code === 'UND_ERR_INVALID_ARG') return notSent('invalid_request', err);
  if (TIMEOUT_CODES.has(code)) return unknown('timeout', err, status);
  if (RESET_CODES.has(code)) return unknown('reset', err, status);
  if (code === 'UND_ERR_RES_EXCEEDED_MAX_SIZE') return unknown('oversized', err, status);
  if (code.startsWith('HPE_') || code === 'UND_ERR_HEADERS_OVERFLOW' || code === 'UND_ERR_INFO') {
    return unknown('protocol', err, status);
  }
  return unknown('error', err, status);
}

/**
 * After a TLS 1.3 handshake, waits for the first session ticket (the server accepted our certificate), an
 * error or close (it refused), or `waitMs` (no ticket: go ahead). Resumed sessions go ahead at once.
 */
function confirmHandshake(socket: TLSSocket, waitMs: number, done: (err: Error | null) => void): void {
  // A resumed session was authenticated by its ticket, issued after the server accepted our certificate.
  if (waitMs <= 0 || socket.getProtocol() !== 'TLSv1.3' || socket.isSessionReused() || socket.destroyed) {
    done(socket.destroyed ? handshakeRejected() : null);
    return;
  }
  const finish = (err: Error | null): void => {
    clearTimeout(timer);
    socket.off('session', onSession).off('error', onError).off('close', onClose).off('end', onClose);
    // 'session' is emitted from inside OpenSSL's read; a request written from there is lost, so hand over later.
    setImmediate(() => done(err ?? (socket.destroyed ? handshakeRejected() : null)));
  };
  const onSession = (): void => finish(null);
  const onError = (err: Error): void => finish(err);
  const onClose = (): void => finish(handshakeRejected());
  const timer = setTimeout(() => finish(null), waitMs);
  socket.once('session', onSession).once('error', onError).once('close', onClose).once('end', onClose);
}

function handshakeRejected(): Error {
  return Object.assign(new Error('the server closed the connection during the TLS handshake'), {
    code: 'ERR_TLS_HANDSHAKE_REJECTED',
  });
}

/**
 * undici, loaded by the first agent built: it is a tenth of a second of CPU to load, and a process that never
 * calls a peer (most CLI commands, which load this file through the configuration's URL checks) skips it.
 */
let undici: typeof import('undici') | undefined;
const loadUndici = (): typeof import('undici') =>
  (undici ??= createRequire(import.meta.url)('undici') as typeof import('undici'));

/**
 * Builds a dedicated undici Agent for one peer: TLS verification always on (`rejectUnauthorized: true`, Node's
 * default host-name check), TLS 1.2 minimum, HTTP/1.1, no proxy, no redirects. Errors raised while connecting
 * are recorded so that {@link postJson} / {@link getJson} report them as `not_sent`. The caller owns the Agent
 * and closes it (`await agent.close()`). Throws `config_invalid` when only one of cert and key is given.
 */
export function createMtlsAgent(options: MtlsAgentOptions): Agent {
  if ((options.cert === undefined) !== (options.key === undefined)) {
    throw new ActionLedgerError('config_invalid', 'a client certificate needs both cert and key');
  }
  const key = options.key instanceof Secret ? options.key.reveal() : options.key;
  const connectTimeoutMs = options.connectTimeoutMs;
  const confirmMs = options.handshakeConfirmMs ?? 200;
  const { Agent, buildConnector, errors } = loadUndici();
  const base = buildConnector({
    ...(options.ca === undefined ? {} : { ca: options.ca }),
    ...(options.cert === undefined ? {} : { cert: options.cert, key }),
    ...(options.servername === undefined ? {} : { servername: options.servername }),
    ...(options.lookup === undefined ? {} : { lookup: options.lookup }),
    rejectUnauthorized: true,
    minVersion: 'TLSv1.2',
    // undici's own connect timer ticks at about 0.5 s resolution: kept only as a backstop that frees the socket.
    timeout: connectTimeoutMs + 1_000,
  });
  const connector: buildConnector.connector = (opts, callback) => {
    let settled = false;
    const settle = (err: Error | null, socket: Socket | null): void => {
      if (settled || err !== null) socket?.destroy();
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err === null && socket !== null) return callback(null, socket);
      const e = err ?? handshakeRejected();
      connectPhase.add(e);
      callback(e, null);
    };
    const timer = setTimeout(() => {
      settle(new errors.ConnectTimeoutError(`TCP connect and TLS handshake took over ${connectTimeoutMs} ms`), null);
    }, connectTimeoutMs);
    base(opts, (...args) => {
      const [err, socket] = args;
      if (err !== null) return settle(err, null);
      if (!('getProtocol' in socket)) return settle(null, socket);
      confirmHandshake(socket, confirmMs, (confirmErr) => settle(confirmErr, socket));
    });
  };
  return new Agent({ connect: connector, allowH2: false });
}

function headerRecord(raw: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(raw)) {
    if (value !== undefined) out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}

interface Exchange {
  method: 'POST' | 'GET';
  body?: string;
}

/** Stops reading a body and closes its connection; the abort error it then emits is expected. */
function discard(body: { destroy(): unknown; on(event: 'error', fn: () => void): unknown }): void {
  body.on('error', () => undefined);
  body.destroy();
}

/** Reads at most `maxBytes` of `body`; returns null (after destroying it) when it would exceed the cap. */
async function readCapped(body: UndiciResponse['body'], maxBytes: number): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    total += chunk.byteLength;
    if (total > maxBytes) {
      discard(body);
      return null;
    }
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks, total);
}

function exchange(agent: Agent, url: string, ex: Exchange, opts: RequestOptions): Promise<HttpOutcome> {
  // Off: the request itself, no span and no extra promise.
  if (!tracingOn()) return send(agent, url, ex, opts);
  // A CLIENT span by the HTTP conventions, its context sent as `traceparent`: the URL without its query, the
  // method, the status or the transport's code; never a header or the body.
  const span = startSpan(`${ex.method} ${opts.spanName ?? 'request'}`, SpanKind.CLIENT, () =>
    clientAttributes(url, ex, opts.urlTemplate),
  );
  return withSpan(span, () => send(agent, url, ex, { ...opts, headers: withTraceHeaders(opts.headers) })).then(
    (outcome) => {
      if (span !== undefined) {
        if (outcome.kind === 'response') span.setAttribute('http.response.status_code', outcome.status);
        else {
          if (outcome.kind === 'unknown' && outcome.status !== undefined)
            span.setAttribute('http.response.status_code', outcome.status);
          failSpan(span, outcome.code);
        }
        if (outcome.kind === 'response' && outcome.status >= 400) failSpan(span, String(outcome.status));
        span.end();
      }
      return outcome;
    },
    (err: unknown) => {
      failSpan(span, errorType(err));
      span?.end();
      throw err;
    },
  );
}

/**
 * The request's headers with the active span's `traceparent` (and `tracestate`) added, each only where the
 * caller's headers have no header of that name in any case: a provider's idempotency header is never replaced
 * (config/ refuses those names for it too), and no header is sent twice.
 */
function withTraceHeaders(headers: Record<string, string> | undefined): Record<string, string> {
  const trace: Record<string, string> = {};
  injectContext(trace);
  const taken = new Set(Object.keys(headers ?? {}).map((n) => n.toLowerCase()));
  const out: Record<string, string> = { ...headers };
  for (const [name, value] of Object.entries(trace)) if (!taken.has(name.toLowerCase())) out[name] = value;
  return out;
}

/** The span's URL attributes: scheme, host and port, and the configured template's path when there is one. */
function clientAttributes(url: string, ex: Exchange, template: string | undefined): Attributes {
  try {
    const u = new URL(url);
    const port = u.port === '' ? 443 : Number(u.port);
    const attributes: Attributes = {
      'http.request.method': ex.method,
      'server.address': u.hostname,
      'server.port': port,
      'url.scheme': u.protocol.replace(/:$/, ''),
      'url.full': `${u.protocol}//${u.host}`,
    };
    const path = template === undefined ? null : templatePath(template);
    if (path !== null) attributes['url.template'] = path;
    return attributes;
  } catch {
    return { 'http.request.method': ex.method };
  }
}

/** The path of a configured URL template, without its query or fragment; null when it has none. */
function templatePath(template: string): string | null {
  const m = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*(\/[^?#]*)/i.exec(template);
  return m?.[1] ?? null;
}

async function send(agent: Agent, url: string, ex: Exchange, opts: RequestOptions): Promise<HttpOutcome> {
  let target: URL;
  try {
    target = new URL(url);
  } catch (cause) {
    return notSent('invalid_request', cause);
  }
  if (target.protocol !== 'https:') return notSent('invalid_request');
  if (opts.signal?.aborted === true) return notSent('aborted', opts.signal.reason);

  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort(Object.assign(new Error('request timed out'), { code: 'timeout' }));
  }, opts.timeoutMs);
  const onCallerAbort = (): void => controller.abort(opts.signal?.reason);
  opts.signal?.addEventListener('abort', onCallerAbort, { once: true });
  const aborted = (err: unknown, status?: number): HttpOutcome | null => {
    if (timedOut) return unknown('timeout', err, status);
    if (opts.signal?.aborted === true) return unknown('aborted', err, status);
    return null;
  };

  let status: number | undefined;
  try {
    const res = await agent.request({
      origin: target.origin,
      path: `${target.pathname}${target.search}`,
      method: ex.method,
      headers: {
        accept: 'application/json',
        ...(ex.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...opts.headers,
      },
      ...(ex.body === undefined ? {} : { body: ex.body }),
      signal: controller.signal,
      headersTimeout: opts.timeoutMs,
      bodyTimeout: opts.timeoutMs,
    });
    status = res.statusCode;
    return await readResponse(res, opts.maxBytes);
  } catch (err) {
    return aborted(err, status) ?? classifyError(err, status !== undefined, status);
  } finally {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onCallerAbort);
  }
}

type UndiciResponse = Awaited<ReturnType<Agent['request']>>;

async function readResponse(res: UndiciResponse, maxBytes: number): Promise<HttpOutcome> {
  const status = res.statusCode;
  const headers = headerRecord(res.headers);
  if (status >= 300 && status < 400) {
    discard(res.body);
    const out = unknown('redirect', undefined, status);
    if (headers.location !== undefined) out.location = headers.location;
    return out;
  }
  const declared = headers['content-length'];
  if (declared !== undefined && Number(declared) > maxBytes) {
    discard(res.body);
    return unknown('oversized', undefined, status);
  }
  const raw = await readCapped(res.body, maxBytes);
  if (raw === null) return unknown('oversized', undefined, status);
  const bodySha256 = createHash('sha256').update(raw).digest('hex');
  if (raw.byteLength === 0) return { kind: 'response', status, headers, json: null, bodySha256 };
  try {
    const json = parseStrictJson(raw, { requireObject: true, bounds: { maxDepth: 32, maxBytes } }) as JsonObject;
    return { kind: 'response', status, headers, json, bodySha256 };
  } catch (err) {
    if (isActionLedgerError(err, 'invalid_json')) return unknown('malformed_json', err, status);
    throw err;
  }
}

/**
 * POSTs `body` (JSON text, sent byte for byte) to an https `url` through `agent`, within `timeoutMs` for the
 * whole exchange, reading at most `maxBytes`. Never throws for network, TLS, HTTP or body problems: the
 * outcome says whether the request was provably not sent, answered, or in an unknown state. Redirects are
 * reported as `unknown` / `redirect`, never followed.
 */
export async function postJson(
  agent: Agent,
  url: string,
  options: RequestOptions & { body: string },
): Promise<HttpOutcome> {
  return exchange(agent, url, { method: 'POST', body: options.body }, options);
}

/** GETs an https `url` (readback, listings) with the same guarantees and outcomes as {@link postJson}. */
export async function getJson(agent: Agent, url: string, options: RequestOptions): Promise<HttpOutcome> {
  return exchange(agent, url, { method: 'GET' }, options);
}

/**
 * Throws `tls_verification_disabled` when `NODE_TLS_REJECT_UNAUTHORIZED` is '0' in `env`. The agents built
 * here set `rejectUnauthorized: true` explicitly, which that variable does not override, but a process that
 * runs with it has other TLS clients (pg, pino transports) that it does silence: refuse to start.
 */
export function assertTlsVerificationEnabled(env: NodeJS.ProcessEnv): void {
  if (env.NODE_TLS_REJECT_UNAUTHORIZED === '0') {
    throw new ActionLedgerError(
      'tls_verification_disabled',
      'NODE_TLS_REJECT_UNAUTHORIZED=0 disables TLS certificate verification; unset it',
    );
  }
}
