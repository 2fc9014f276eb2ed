/**
 * OpenTelemetry tracing, off unless the environment names an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Off, nothing of the SDK is loaded: this file imports only
 * `@opentelemetry/api`, and every helper below first tests one boolean, so the hot path allocates no span, no
 * attributes and no context. On, `startTracing` loads core/tracing-sdk.ts (the SDK, the OTLP/HTTP exporter), which
 * reads the standard variables: the endpoint and `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
 * `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default parentbased_always_on).
 *
 * An operation keeps the trace context it was reserved under (`operations.trace_context`: the W3C `traceparent`,
 * and its `tracestate` after a newline; never anything else of the request), so a dispatcher in another process,
 * minutes later, continues that trace: its spans are children of the stored context and link to it.
 *
 * Span attributes name operations, tools, tenants, routes and outcomes; they never carry arguments, bodies,
 * headers or credentials (the log's redaction, core/log.ts, by construction: no helper here takes them).
 */
import {
  context,
  createTraceState,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  TraceFlags,
  type Attributes,
  type Context,
  type Span,
  type SpanContext,
  type TextMapGetter,
  type Tracer,
} from '@opentelemetry/api';

export { ROOT_CONTEXT, SpanKind };
export type { Attributes, Context, Span };

/** What `startTracing` loaded: its tracer provider's flush and shutdown. */
export interface TracingSdk {
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

let on = false;
let tracer: Tracer | undefined;
let sdk: Promise<TracingSdk | null> | undefined;

/** Whether spans are recorded in this process (an OTLP endpoint was configured, or {@link enableTracing}). */
export function tracingOn(): boolean {
  return on;
}

/** Whether `env` asks for traces: an OTLP endpoint named, and neither the SDK nor the trace exporter turned off. */
export function tracingConfigured(env: NodeJS.ProcessEnv): boolean {
  if ((env.OTEL_SDK_DISABLED ?? '').trim().toLowerCase() === 'true') return false;
  if ((env.OTEL_TRACES_EXPORTER ?? '').trim().toLowerCase() === 'none') return false;
  return (
    (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? '').trim() !== '' ||
    (env.OTEL_EXPORTER_OTLP_ENDPOINT ?? '').trim() !== ''
  );
}

/**
 * Starts tracing for this process when `env` asks for it (see the file comment); once per process, later calls
 * answer the first one's result. `name` is the process's part (`service`, `dispatcher`, `cli`), a resource
 * attribute beside `service.name` (default `actionledger`), `service.instance.id` (fresh per process) and the pid.
 */
export function startTracing(env: NodeJS.ProcessEnv, name: string): Promise<TracingSdk | null> {
  if (sdk !== undefined) return sdk;
  if (!tracingConfigured(env)) return Promise.resolve(null);
  sdk = import('./tracing-sdk.js').then(({ startSdk }) => {
    const started = startSdk(env, name);
    enableTracing();
    return started;
  });
  return sdk;
}

/** How long {@link flushTracing} waits for the collector before giving up on what is buffered. */
export const FLUSH_WAIT_MS = 2_000;

/**
 * Exports what is buffered (a process about to exit, a runtime closing); nothing when tracing is off. Waits at most
 * `waitMs` (default {@link FLUSH_WAIT_MS}): a collector that accepts the connection and never answers does not hold
 * up a worker's, the service's or the CLI's exit (the exporter's own timeout is 10 s); what it had not taken is
 * lost.
 */
export async function flushTracing(waitMs: number = FLUSH_WAIT_MS): Promise<void> {
  const started = await sdk;
  if (started === null || started === undefined) return;
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, waitMs);
    timer.unref();
  });
  try {
    await Promise.race([started.flush().catch(() => undefined), bound]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Records spans through whatever provider is registered with `@opentelemetry/api`: for a library caller that
 * registered its own SDK (the service calls it through {@link startTracing}).
 */
export function enableTracing(): void {
  on = true;
  tracer = trace.getTracer('actionledger');
}

/** Stops recording spans in this process (the benchmark's alternating cells); what is registered stays. */
export function disableTracing(): void {
  on = false;
  tracer = undefined;
}

const headerGetter: TextMapGetter<Record<string, string | string[] | undefined>> = {
  keys: (carrier) => Object.keys(carrier),
  get: (carrier, key) => carrier[key],
};

/** The context an incoming request's `traceparent` / `tracestate` name (the active one when it names none). */
export function extractContext(headers: Record<string, string | string[] | undefined>): Context {
  return propagation.extract(context.active(), headers, headerGetter);
}

/**
 * The context an untrusted caller's request names (the API's and MCP's callers): its `traceparent` only. A
 * caller's `tracestate` is vendor data it controls; it is dropped here, so it is never stored with an
 * operation nor sent on to the authorization service or a provider.
 */
export function extractCallerContext(headers: Record<string, string | string[] | undefined>): Context {
  return extractContext({ traceparent: headers.traceparent });
}

/** Adds `traceparent` (and `tracestate`) for the active span to outgoing `headers`; nothing when tracing is off. */
export function injectContext(headers: Record<string, string>): void {
  if (on) propagation.inject(context.active(), headers);
}

/**
 * Starts a span (a child of `parent`, default the active context) when tracing is on; `undefined` when off.
 * `attributes` is called only for a span that records.
 */
export function startSpan(
  name: string,
  kind: SpanKind,
  attributes?: () => Attributes,
  options: { parent?: Context; links?: SpanContext[]; startTime?: number } = {},
): Span | undefined {
  if (!on || tracer === undefined) return undefined;
  const span = tracer.startSpan(
    name,
    {
      kind,
      ...(options.links === undefined ? {} : { links: options.links.map((c) => ({ context: c })) }),
      ...(options.startTime === undefined ? {} : { startTime: options.startTime }),
    },
    options.parent ?? context.active(),
  );
  if (attributes !== undefined && span.isRecording()) span.setAttributes(attributes());
  return span;
}

/** Ends `span` with an error status naming `code` (a stable error code or class, never a message with data). */
export function failSpan(span: Span | undefined, code: string): void {
  if (span === undefined) return;
  span.setStatus({ code: SpanStatusCode.ERROR });
  if (span.isRecording()) span.setAttribute('error.type', code);
}

/**
 * Runs `fn` inside a span named `name` (active for what `fn` starts), ending it when `fn` settles; a thrown
 * error's stable code (or its class) is the span's `error.type`. Off: `fn()` alone.
 */
export function inSpan<T>(
  name: string,
  kind: SpanKind,
  attributes: (() => Attributes) | undefined,
  fn: (span: Span | undefined) => Promise<T>,
): Promise<T> {
  if (!on) return fn(undefined);
  const span = startSpan(name, kind, attributes);
  if (span === undefined) return fn(undefined);
  return context
    .with(trace.setSpan(context.active(), span), () => fn(span))
    .then(
      (value) => {
        span.end();
        return value;
      },
      (err: unknown) => {
        failSpan(span, errorType(err));
        span.end();
        throw err;
      },
    );
}

/** Runs `fn` with `span` active (its children are `span`'s); off or without a span, `fn()` alone. */
export function withSpan<T>(span: Span | undefined, fn: () => T, parent?: Context): T {
  if (span === undefined) return fn();
  return context.with(trace.setSpan(parent ?? context.active(), span), fn);
}

/** The stable code of an error (ActionLedgerError's `code`, an errno) or its class name. */
export function errorType(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && /^[A-Za-z0-9_.-]{1,64}$/.test(code)) return code;
  return (err as Error | null)?.name ?? 'error';
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * The active span's context as stored with an operation: `traceparent`, and `\n` + `tracestate` when there is one.
 * Null when tracing is off or no valid span is active.
 */
export function activeTraceContext(): string | null {
  if (!on) return null;
  const sc = trace.getActiveSpan()?.spanContext();
  if (sc === undefined || !trace.isSpanContextValid(sc)) return null;
  return formatTraceContext(sc);
}

/** The most bytes a stored trace context may have (the CHECK on `operations.trace_context`, sql/0020). */
export const TRACE_CONTEXT_MAX_BYTES = 1024;

/**
 * A span context as stored: its `traceparent`, and `\n` + its `tracestate` only when the whole fits
 * {@link TRACE_CONTEXT_MAX_BYTES} (a longer, non-standard `tracestate` is dropped rather than fail the
 * reservation's INSERT at the column's CHECK).
 */
export function formatTraceContext(sc: SpanContext): string {
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, '0');
  const parent = `00-${sc.traceId}-${sc.spanId}-${flags}`;
  const state = sc.traceState?.serialize() ?? '';
  if (state === '') return parent;
  const stored = `${parent}\n${state}`;
  return Buffer.byteLength(stored, 'utf8') <= TRACE_CONTEXT_MAX_BYTES ? stored : parent;
}

/** A stored trace context as a remote span context; null when it is absent or not a valid `traceparent`. */
export function parseTraceContext(stored: string | null | undefined): SpanContext | null {
  if (stored === null || stored === undefined) return null;
  const nl = stored.indexOf('\n');
  const m = TRACEPARENT.exec(nl < 0 ? stored : stored.slice(0, nl));
  if (m === null) return null;
  const sc: SpanContext = {
    traceId: m[1] ?? '',
    spanId: m[2] ?? '',
    traceFlags: parseInt(m[3] ?? '0', 16) & TraceFlags.SAMPLED,
    isRemote: true,
    ...(nl < 0 ? {} : { traceState: createTraceState(stored.slice(nl + 1)) }),
  };
  return trace.isSpanContextValid(sc) ? sc : null;
}

/** The trace id of a stored trace context (`actionledger show`), or null. */
export function traceIdOf(stored: string | null | undefined): string | null {
  return parseTraceContext(stored)?.traceId ?? null;
}

/**
 * Starts a span that resumes the trace an operation was reserved under: a child of the stored context, and
 * linked to it (the messaging conventions' "process" span: another process, maybe minutes later). Without a
 * stored context it starts a trace of its own. `undefined` when tracing is off.
 */
export function resumeSpan(
  name: string,
  kind: SpanKind,
  stored: string | null | undefined,
  attributes: () => Attributes,
  startTime?: number,
): Span | undefined {
  if (!on) return undefined;
  const sc = parseTraceContext(stored);
  const parent = sc === null ? ROOT_CONTEXT : trace.setSpanContext(ROOT_CONTEXT, sc);
  return startSpan(name, kind, attributes, {
    parent,
    ...(sc === null ? {} : { links: [sc] }),
    ...(startTime === undefined ? {} : { startTime }),
  });
}

/**
 * A span that only links to an operation's stored trace (a reconciliation pass, a review action, a
 * compensation: work of its own, about that operation), a child of the active context. `undefined` when off.
 */
export function linkedSpan(
  name: string,
  kind: SpanKind,
  stored: readonly (string | null | undefined)[],
  attributes: () => Attributes,
): Span | undefined {
  if (!on) return undefined;
  const links = stored.map(parseTraceContext).filter((c): c is SpanContext => c !== null);
  return startSpan(name, kind, attributes, { links });
}

/** Links the active span to an operation's stored trace (a review action, once it has read the operation). */
export function linkActiveSpan(stored: string | null | undefined): void {
  if (!on) return;
  const sc = parseTraceContext(stored);
  if (sc !== null) trace.getActiveSpan()?.addLink({ context: sc });
}

/** The active span's ids for a log line (pino's mixin); empty when none records. */
export function traceLogFields(): { trace_id?: string; span_id?: string } {
  const span = trace.getActiveSpan();
  if (span === undefined) return {};
  const sc = span.spanContext();
  if ((sc.traceFlags & TraceFlags.SAMPLED) === 0) return {};
  return { trace_id: sc.traceId, span_id: sc.spanId };
}

/** `span`'s trace id when it is sampled (a histogram exemplar's label), or undefined (no span: tracing off). */
export function sampledTraceIdOf(span: Span | undefined): string | undefined {
  if (span === undefined) return undefined;
  const sc = span.spanContext();
  return (sc.traceFlags & TraceFlags.SAMPLED) !== 0 ? sc.traceId : undefined;
}

/** The active span's trace id when it is sampled (a histogram exemplar's label), or undefined. */
export function sampledTraceId(): string | undefined {
  if (!on) return undefined;
  const sc = trace.getActiveSpan()?.spanContext();
  return sc !== undefined && (sc.traceFlags & TraceFlags.SAMPLED) !== 0 ? sc.traceId : undefined;
}

/** A context holding only `span` (the parent of spans that must not inherit whatever is active). */
export function contextOf(span: Span): Context {
  return trace.setSpan(ROOT_CONTEXT, span);
}
