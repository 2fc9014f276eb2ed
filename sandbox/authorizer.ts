/**
 * A sandbox authorization service over real mutual TLS: the other side of the dispatch contract's fresh
 * authorization decision, for tests and `npm start`.
 *
 * `POST /v1/authorize` takes a JSON object with exactly the binding fields (protocol/authorization.ts, each a
 * non-empty string), parsed with `parseStrictJson` (duplicate keys, wrong root type and the like are
 * 400 `invalid_request`). It answers 200 with every request field echoed, `decision` ("allow" / "deny", from
 * the `decide` callback, default allow), and `authorized_at` / `expires_at` as ISO 8601 UTC strings
 * (default TTL 60 s).
 *
 * Fault modes ({@link AuthorizerFault}) corrupt the next N matching answers one way each, so a test can check
 * that the dispatcher refuses every one of them and never calls the provider. Every request is recorded,
 * invalid ones included, so a test can also assert what the dispatcher sent.
 *
 * It answers from the wire format in protocol/, not from the dispatcher's code; that format's field lists are
 * pinned by their own test, so a change to them cannot pass unseen because both sides moved together.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { parseStrictJson, type JsonObject, type JsonValue } from '../core/json.js';
import {
  MtlsJsonServer,
  clientCommonName,
  readBody,
  sendJson,
  type ListenOptions,
  type ServerTls,
} from '../transport/index.js';
import {
  AUTHORIZE_PATH,
  decisionBody,
  parseAuthorizationRequest,
  type AuthorizationRequest,
  type BindingField,
  type DECISION_FIELDS,
  type Verdict,
} from '../protocol/index.js';

export type Decision = Verdict;
type AuthorizationField = BindingField;
type ResponseField = BindingField | (typeof DECISION_FIELDS)[number];

export type AuthorizerFault =
  /** decision "deny" regardless of `decide`. */
  | { kind: 'deny' }
  /** Leaves one field out of the answer (default `args_sha256`). */
  | { kind: 'missingField'; field?: ResponseField }
  /** Adds a field the contract does not have. */
  | { kind: 'extraField'; name?: string; value?: JsonValue }
  /** Echoes one binding field with another value (default `args_sha256`). */
  | { kind: 'mismatchedBinding'; field?: AuthorizationField; value?: string }
  /** `"decision":"deny"` then `"decision":"allow"`: a lenient parser keeps the last one. */
  | { kind: 'duplicateKey' }
  /** A valid answer padded to `bytes` bytes. */
  | { kind: 'oversized'; bytes: number }
  /** authorized_at `ageMs` ago (default 1 h); expires_at still in the future. */
  | { kind: 'stale'; ageMs?: number }
  /** expires_at `agoMs` ago (default 1 s), authorized_at a second before that. */
  | { kind: 'expired'; agoMs?: number }
  /** expires_at `ttlMs` after authorized_at (default 1 day). */
  | { kind: 'ttlTooLong'; ttlMs?: number }
  /** Answers normally after `delayMs`. */
  | { kind: 'slow'; delayMs: number }
  /** Its clock runs `skewMs` ahead (negative: behind); the answer is otherwise normal. */
  | { kind: 'clockSkew'; skewMs: number }
  /** That status (default 500) with a JSON error body. */
  | { kind: 'status'; status?: number; body?: JsonValue };

export interface AuthorizerFaultSelector {
  /** How many matching requests the fault applies to. Default 1; `Infinity` until cleared. */
  times?: number;
  /** Only requests this accepts. */
  when?: (request: AuthorizationRequest) => boolean;
}

export interface AuthorizerRequestRecord {
  /** The parsed request, or null when it was not a valid authorization request. */
  request: AuthorizationRequest | null;
  raw: string;
  headers: IncomingHttpHeaders;
  clientCommonName: string | undefined;
  at: Date;
}

export interface SandboxAuthorizerOptions extends ListenOptions {
  tls: ServerTls;
  /** Policy; default: allow everything. */
  decide?: (request: AuthorizationRequest) => Decision | Promise<Decision>;
  /** Decision lifetime. Default 60 000 ms. */
  ttlMs?: number;
}

const MAX_REQUEST_BYTES = 64 * 1024;

interface FaultRule {
  fault: AuthorizerFault;
  remaining: number;
  when: ((request: AuthorizationRequest) => boolean) | undefined;
}

export class SandboxAuthorizer extends MtlsJsonServer {
  /** Replaceable at run time. */
  decide: (request: AuthorizationRequest) => Decision | Promise<Decision>;
  ttlMs: number;
  readonly #requests: AuthorizerRequestRecord[] = [];
  #rules: FaultRule[] = [];

  constructor(options: SandboxAuthorizerOptions) {
    super(options.tls, options);
    this.decide = options.decide ?? (() => 'allow');
    this.ttlMs = options.ttlMs ?? 60_000;
  }

  /** `url` + `/v1/authorize`. */
  get authorizeUrl(): string {
    return `${this.url}${AUTHORIZE_PATH}`;
  }

  /** Applies `fault` to the next `times` valid requests that `when` accepts. */
  inject(fault: AuthorizerFault, selector: AuthorizerFaultSelector = {}): void {
    this.#rules.push({ fault, remaining: selector.times ?? 1, when: selector.when });
  }

  clearFaults(): void {
    this.#rules = [];
  }

  /** Every request received after the TLS handshake, in order. */
  requests(): AuthorizerRequestRecord[] {
    return [...this.#requests];
  }

  #takeFault(request: AuthorizationRequest): AuthorizerFault | undefined {
    const rule = this.#rules.find((r) => r.remaining > 0 && (r.when === undefined || r.when(request)));
    if (rule === undefined) return undefined;
    rule.remaining -= 1;
    this.#rules = this.#rules.filter((r) => r.remaining > 0);
    return rule.fault;
  }

  protected override async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = await readBody(req, MAX_REQUEST_BYTES);
    const record: AuthorizerRequestRecord = {
      request: null,
      raw: raw?.toString('utf8') ?? '',
      headers: { ...req.headers },
      clientCommonName: clientCommonName(req),
      at: new Date(),
    };
    this.#requests.push(record);
    const path = new URL(req.url ?? '/', 'https://sandbox').pathname;
    if (req.method !== 'POST' || path !== AUTHORIZE_PATH) return sendJson(res, 404, { error: 'not_found' });
    if (raw === null) return sendJson(res, 413, { error: 'request_too_large' });
    let request: AuthorizationRequest | null = null;
    try {
      request = parseAuthorizationRequest(parseStrictJson(raw, { requireObject: true }) as JsonObject);
    } catch {
      request = null;
    }
    if (request === null) return sendJson(res, 400, { error: 'invalid_request' });
    record.request = request;
    const fault = this.#takeFault(request);
    if (fault?.kind === 'slow') {
      await new Promise<void>((resolve) => this.later(fault.delayMs, resolve));
    }
    if (fault?.kind === 'status') {
      return sendJson(res, fault.status ?? 500, fault.body ?? { error: 'injected' });
    }
    const decision: Decision = fault?.kind === 'deny' ? 'deny' : await this.decide(request);
    sendJson(res, 200, this.#answer(request, decision, fault));
  }

  /** The answer as JSON text: built as an object, then corrupted as the fault says. */
  #answer(request: AuthorizationRequest, decision: Decision, fault: AuthorizerFault | undefined): string {
    const now = Date.now() + (fault?.kind === 'clockSkew' ? fault.skewMs : 0);
    let authorizedAt = now;
    let expiresAt = now + this.ttlMs;
    if (fault?.kind === 'stale') authorizedAt = now - (fault.ageMs ?? 3_600_000);
    if (fault?.kind === 'expired') {
      expiresAt = now - (fault.agoMs ?? 1_000);
      authorizedAt = expiresAt - 1_000;
    }
    if (fault?.kind === 'ttlTooLong') expiresAt = authorizedAt + (fault.ttlMs ?? 86_400_000);
    const body: Record<string, JsonValue> = decisionBody(request, decision, authorizedAt, expiresAt);
    switch (fault?.kind) {
      case 'missingField':
        delete body[fault.field ?? 'args_sha256'];
        break;
      case 'extraField':
        body[fault.name ?? 'scope'] = fault.value ?? 'all';
        break;
      case 'mismatchedBinding': {
        const field = fault.field ?? 'args_sha256';
        body[field] = fault.value ?? `${request[field]}-other`;
        break;
      }
      case 'duplicateKey': {
        const rest = { ...body };
        delete rest.decision;
        return `{"decision":"deny",${JSON.stringify(rest).slice(1, -1)},"decision":"allow"}`;
      }
      case 'oversized': {
        const text = JSON.stringify(body);
        const pad = Math.max(0, fault.bytes - text.length - ',"padding":""'.length);
        return `${text.slice(0, -1)},"padding":"${'x'.repeat(pad)}"}`;
      }
      default:
        break;
    }
    return JSON.stringify(body);
  }
}
