/**
 * A sandbox payment provider over real mutual TLS, for tests and `npm start`.
 *
 * Routes (every one requires `Authorization: Bearer <token>` when a token is configured, 401 otherwise):
 * - `POST <path>` (default `/v1/refunds`): JSON body, `Idempotency-Key` header. The first request with a key
 *   records one effect and answers 201 `{"operation_id": "...", "status": "applied"}` with `x-request-id`.
 *   A repeat with the same key and the same body answers the same receipt (and `idempotent-replayed: true`)
 *   without a new effect, as Stripe does; the same key with a different body is 422 and changes nothing.
 *   With `honorIdempotencyKey: false` the provider behaves like one without idempotency support: every
 *   committed request is a new effect, so a duplicate dispatch becomes visible.
 * - `GET <path>/by-key/<key>`: authoritative readback, 200 `{"state":"applied", ...}` or 404 `{"state":"no_effect"}`.
 * - `GET /v1/effects`: every effect, grouped by key.
 *
 * Fault modes ({@link ProviderFault}) are injected at run time for the next N matching requests, optionally
 * only for keys a predicate accepts. Whether a fault records the effect is its `commit` flag; the defaults:
 *
 * | fault               | default commit | what the client sees                                      |
 * |---------------------|----------------|-----------------------------------------------------------|
 * | status              | no             | that status with a JSON body                              |
 * | timeout             | no             | nothing, ever                                             |
 * | hangHeaders         | no             | a status line and one header, then nothing                |
 * | slowDrip            | yes            | 201 headers, then the receipt one byte per `intervalMs`   |
 * | oversized           | yes            | 201 with a valid JSON body of `bytes` bytes               |
 * | duplicateKeyJson    | yes            | 201 `{"operation_id":"<id>","operation_id":"other"}`      |
 * | noReceipt           | yes            | 201 `{"status":"applied"}`, no operation_id or x-request-id |
 * | redirect            | no             | 302 to `location`                                         |
 * | commitThenReset     | yes            | the socket destroyed without an answer                    |
 * | resetBeforeCommit   | no             | the socket destroyed without an answer                    |
 * | readbackFailing     | (readback)     | 503                                                       |
 * | readbackInconclusive| (readback)     | 200 `{"state":"pending"}`                                 |
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { parseStrictJson, type JsonValue } from '../core/json.js';
import {
  MtlsJsonServer,
  clientCommonName,
  readBody,
  sendJson,
  type ListenOptions,
  type ServerTls,
} from '../transport/index.js';
import { EffectJournal, type ProviderEffect } from './effect-journal.js';

export type { ProviderEffect } from './effect-journal.js';

export type ProviderFault =
  | { kind: 'status'; status: number; body?: JsonValue; commit?: boolean }
  | { kind: 'timeout'; commit?: boolean }
  | { kind: 'hangHeaders'; commit?: boolean }
  | { kind: 'slowDrip'; intervalMs?: number; commit?: boolean }
  | { kind: 'oversized'; bytes: number; chunked?: boolean; commit?: boolean }
  | { kind: 'duplicateKeyJson'; commit?: boolean }
  | { kind: 'noReceipt'; commit?: boolean }
  | { kind: 'redirect'; location?: string; commit?: boolean }
  | { kind: 'commitThenReset' }
  | { kind: 'resetBeforeCommit' }
  | { kind: 'readbackFailing' }
  | { kind: 'readbackInconclusive' };

export interface FaultSelector {
  /** How many matching requests the fault applies to. Default 1; `Infinity` until cleared. */
  times?: number;
  /** Only requests whose Idempotency-Key this accepts. */
  when?: (key: string) => boolean;
}

/** Every request received (after the TLS handshake), in arrival order. */
export interface ProviderRequest {
  method: string;
  path: string;
  key: string | undefined;
  headers: IncomingHttpHeaders;
  body: string;
  clientCommonName: string | undefined;
  at: Date;
}

export interface SandboxProviderOptions extends ListenOptions {
  tls: ServerTls;
  /** Bearer token every request must carry; none: no Authorization check. */
  token?: string;
  /** Effect path. Default `/v1/refunds`. */
  path?: string;
  /** More effect paths served the same way (a compensation tool's endpoint, for example). */
  extraPaths?: string[];
  /** Default true (Stripe-like). False: every committed request is a new effect. */
  honorIdempotencyKey?: boolean;
  /**
   * A file that keeps the applied effects across restarts (created when missing): loaded at construction,
   * each new effect flushed to it before its receipt is sent. None: effects live in memory only.
   */
  journal?: string;
}

const READBACK_KINDS = new Set<ProviderFault['kind']>(['readbackFailing', 'readbackInconclusive']);
const COMMIT_BY_DEFAULT = new Set<ProviderFault['kind']>([
  'slowDrip',
  'oversized',
  'duplicateKeyJson',
  'noReceipt',
  'commitThenReset',
]);
const MAX_REQUEST_BYTES = 1024 * 1024;

interface FaultRule {
  fault: ProviderFault;
  remaining: number;
  when: ((key: string) => boolean) | undefined;
}

function commits(fault: ProviderFault): boolean {
  return ('commit' in fault ? fault.commit : undefined) ?? COMMIT_BY_DEFAULT.has(fault.kind);
}

const newId = (prefix: string): string => `${prefix}_${randomBytes(9).toString('hex')}`;

export class SandboxProvider extends MtlsJsonServer {
  readonly path: string;
  /** Every effect path: `path` first, then `extraPaths`. */
  readonly paths: readonly string[];
  readonly #token: Buffer | undefined;
  readonly #honorKey: boolean;
  readonly #effects: ProviderEffect[] = [];
  /** The first effect of each key: what readback and an idempotent replay look up (a scan was quadratic). */
  readonly #firstEffect = new Map<string, ProviderEffect>();
  readonly #requests: ProviderRequest[] = [];
  #rules: FaultRule[] = [];
  readonly #journal: EffectJournal | undefined;

  constructor(options: SandboxProviderOptions) {
    super(options.tls, options);
    this.path = options.path ?? '/v1/refunds';
    this.paths = [this.path, ...(options.extraPaths ?? [])];
    this.#token = options.token === undefined ? undefined : Buffer.from(`Bearer ${options.token}`);
    this.#honorKey = options.honorIdempotencyKey ?? true;
    if (options.journal !== undefined) {
      const journal = new EffectJournal(options.journal);
      try {
        for (const effect of journal.load()) this.#record(effect);
      } catch (err) {
        journal.close();
        throw err;
      }
      this.#journal = journal;
    }
  }

  protected override async onStop(): Promise<void> {
    await super.onStop();
    this.#journal?.close();
  }

  #record(effect: ProviderEffect): void {
    this.#effects.push(effect);
    if (!this.#firstEffect.has(effect.key)) this.#firstEffect.set(effect.key, effect);
  }

  /** The effect endpoint, `url` + `path`. */
  get endpoint(): string {
    return `${this.url}${this.path}`;
  }

  /** The readback URL for one key (any effect path's readback finds any key). */
  readbackUrl(key: string): string {
    return `${this.endpoint}/by-key/${encodeURIComponent(key)}`;
  }

  /** The endpoint of one of the effect paths. */
  endpointFor(path: string): string {
    return `${this.url}${path}`;
  }

  /** Applies `fault` to the next `times` matching requests (POSTs, or readbacks for the readback kinds). */
  inject(fault: ProviderFault, selector: FaultSelector = {}): void {
    this.#rules.push({ fault, remaining: selector.times ?? 1, when: selector.when });
  }

  clearFaults(): void {
    this.#rules = [];
  }

  /** POSTs received with this Idempotency-Key (replays and faulted ones included). */
  requestsFor(key: string): number {
    return this.#requests.filter((r) => r.method === 'POST' && r.key === key).length;
  }

  /** Effects recorded for this key: 0 or 1 when idempotency keys are honoured. */
  effectsFor(key: string): number {
    return this.#effects.filter((e) => e.key === key).length;
  }

  allEffects(): ProviderEffect[] {
    return [...this.#effects];
  }

  requests(): ProviderRequest[] {
    return [...this.#requests];
  }

  #takeFault(key: string, readback: boolean): ProviderFault | undefined {
    const rule = this.#rules.find(
      (r) => r.remaining > 0 && READBACK_KINDS.has(r.fault.kind) === readback && (r.when === undefined || r.when(key)),
    );
    if (rule === undefined) return undefined;
    rule.remaining -= 1;
    this.#rules = this.#rules.filter((r) => r.remaining > 0);
    return rule.fault;
  }

  #authorized(req: IncomingMessage): boolean {
    if (this.#token === undefined) return true;
    const given = Buffer.from(req.headers.authorization ?? '');
    return given.length === this.#token.length && timingSafeEqual(given, this.#token);
  }

  protected override async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req, MAX_REQUEST_BYTES);
    const path = new URL(req.url ?? '/', 'https://sandbox').pathname;
    const keyHeader = req.headers['idempotency-key'];
    const key = typeof keyHeader === 'string' ? keyHeader : undefined;
    this.#requests.push({
      method: req.method ?? '',
      path,
      key,
      headers: { ...req.headers },
      body: raw?.toString('utf8') ?? '',
      clientCommonName: clientCommonName(req),
      at: new Date(),
    });
    if (!this.#authorized(req)) return sendJson(res, 401, { error: 'unauthorized' });
    if (raw === null) return sendJson(res, 413, { error: 'request_too_large' });
    const readbackPrefix = this.paths.map((p) => `${p}/by-key/`).find((p) => path.startsWith(p));
    if (req.method === 'GET' && readbackPrefix !== undefined) {
      return this.#readback(decodeURIComponent(path.slice(readbackPrefix.length)), res);
    }
    if (req.method === 'GET' && path === '/v1/effects') return this.#listEffects(res);
    if (req.method === 'POST' && this.paths.includes(path)) return this.#effect(key, raw, req, res);
    sendJson(res, 404, { error: 'not_found' });
  }

  #readback(key: string, res: ServerResponse): void {
    const fault = this.#takeFault(key, true);
    if (fault?.kind === 'readbackFailing') return sendJson(res, 503, { error: 'unavailable' });
    if (fault?.kind === 'readbackInconclusive') return sendJson(res, 200, { state: 'pending' });
    const effect = this.#firstEffect.get(key);
    if (effect === undefined) return sendJson(res, 404, { state: 'no_effect' });
    sendJson(res, 200, {
      state: 'applied',
      operation_id: effect.operationId,
      request_id: effect.requestId,
      body_sha256: effect.bodySha256,
    });
  }

  #listEffects(res: ServerResponse): void {
    const byKey: Record<string, unknown[]> = {};
    for (const e of this.#effects) {
      (byKey[e.key] ??= []).push({
        operation_id: e.operationId,
        body_sha256: e.bodySha256,
        body: e.body,
        at: e.at.toISOString(),
      });
    }
    sendJson(res, 200, { effects: byKey });
  }

  #effect(key: string | undefined, raw: Buffer, req: IncomingMessage, res: ServerResponse): void {
    if (key === undefined || key === '') return sendJson(res, 400, { error: 'missing_idempotency_key' });
    let body: JsonValue;
    try {
      body = parseStrictJson(raw, { requireObject: true });
    } catch {
      return sendJson(res, 400, { error: 'invalid_json' });
    }
    const fault = this.#takeFault(key, false);
    if (fault !== undefined && !commits(fault)) return this.#applyFault(fault, undefined, req, res);
    const committed = this.#commit(key, raw, body);
    if (committed === 'key_reused') {
      return sendJson(res, 422, { error: 'idempotency_key_reused', message: 'the key was used with a different body' });
    }
    if (fault === undefined) return this.#receipt(res, committed.effect, committed.replayed);
    this.#applyFault(fault, committed.effect, req, res);
  }

  /** Records the effect once per key (or every time, without idempotency); refuses a reused key. */
  #commit(key: string, raw: Buffer, body: JsonValue): { effect: ProviderEffect; replayed: boolean } | 'key_reused' {
    const sha = createHash('sha256').update(raw).digest('hex');
    const existing = this.#honorKey ? this.#firstEffect.get(key) : undefined;
    if (existing !== undefined)
      return existing.bodySha256 === sha ? { effect: existing, replayed: true } : 'key_reused';
    const effect = { key, bodySha256: sha, body, operationId: newId('op'), requestId: newId('req'), at: new Date() };
    this.#journal?.append(effect);
    this.#record(effect);
    return { effect, replayed: false };
  }

  #receipt(res: ServerResponse, effect: ProviderEffect, replayed: boolean): void {
    const headers: Record<string, string> = { 'x-request-id': effect.requestId };
    if (replayed) headers['idempotent-replayed'] = 'true';
    sendJson(res, 201, { operation_id: effect.operationId, status: 'applied' }, headers);
  }

  #applyFault(
    fault: ProviderFault,
    effect: ProviderEffect | undefined,
    req: IncomingMessage,
    res: ServerResponse,
  ): void {
    const opId = effect?.operationId ?? newId('op');
    switch (fault.kind) {
      case 'status':
        return sendJson(res, fault.status, fault.body ?? { error: 'injected', status: fault.status });
      case 'timeout':
        return; // never answered; stop() destroys the socket
      case 'hangHeaders':
        req.socket.write('HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n');
        return;
      case 'slowDrip':
        return this.#drip(res, JSON.stringify({ operation_id: opId, status: 'applied' }), fault.intervalMs ?? 50);
      case 'oversized':
        return this.#oversized(res, opId, fault.bytes, fault.chunked ?? false);
      case 'duplicateKeyJson':
        return sendJson(res, 201, `{"operation_id":"${opId}","operation_id":"other"}`);
      case 'noReceipt':
        return sendJson(res, 201, { status: 'applied' });
      case 'redirect':
        return sendJson(
          res,
          302,
          { redirect: true },
          { location: fault.location ?? 'https://elsewhere.invalid/v1/refunds' },
        );
      case 'commitThenReset':
      case 'resetBeforeCommit':
        req.socket.destroy();
        return;
      case 'readbackFailing':
      case 'readbackInconclusive':
        return; // never selected for a POST
    }
  }

  #drip(res: ServerResponse, text: string, intervalMs: number): void {
    res.writeHead(201, { 'content-type': 'application/json' }); // chunked: no Content-Length
    res.flushHeaders();
    let i = 0;
    const step = (): void => {
      if (res.destroyed) return;
      if (i >= text.length) return void res.end();
      res.write(text.charAt(i++));
      this.later(intervalMs, step);
    };
    step();
  }

  #oversized(res: ServerResponse, opId: string, bytes: number, chunked: boolean): void {
    const head = `{"operation_id":"${opId}","padding":"`;
    const tail = '"}';
    const pad = Math.max(0, bytes - head.length - tail.length);
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (!chunked) headers['content-length'] = String(head.length + pad + tail.length);
    res.writeHead(201, headers);
    res.write(head);
    const chunk = 'x'.repeat(16 * 1024);
    let left = pad;
    const pump = (): void => {
      while (left > 0 && !res.destroyed) {
        const n = Math.min(left, chunk.length);
        left -= n;
        if (!res.write(chunk.slice(0, n))) return void res.once('drain', pump);
      }
      if (!res.destroyed) res.end(tail);
    };
    pump();
  }
}
