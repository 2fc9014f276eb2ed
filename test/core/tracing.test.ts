/**
 * core/tracing.ts. Off (no OTLP endpoint in the environment): the SDK is never loaded, not even by the whole
 * library's entry point, no provider is registered, and every helper answers without a span. On: spans, the
 * stored trace context and its parsing, the dispatcher's resumed span (child of the stored context and linked to
 * it), and log lines carrying the active span's ids.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import {
  activeTraceContext,
  enableTracing,
  formatTraceContext,
  inSpan,
  injectContext,
  parseTraceContext,
  resumeSpan,
  SpanKind,
  startSpan,
  traceIdOf,
  tracingConfigured,
  tracingOn,
} from '../../core/tracing.js';
import { createLogger } from '../../core/log.js';
import { nodeCommand } from '../helpers/node-child.js';

const DIST = join(import.meta.dirname, '..', '..');

/** Loads the library in a child with `env`, starts tracing as a process would, and reports what was loaded. */
function probe(env: Record<string, string>): Promise<{ sdkLoaded: boolean; on: boolean; provider: boolean }> {
  const script = `
    import { createRequire } from 'node:module';
    await import(${JSON.stringify(join(DIST, 'index.js'))});
    const tracing = await import(${JSON.stringify(join(DIST, 'core', 'tracing.js'))});
    await tracing.startTracing(process.env, 'probe');
    const cache = Object.keys(createRequire(import.meta.url).cache);
    const api = globalThis[Symbol.for('opentelemetry.js.api.1')];
    process.stdout.write(JSON.stringify({
      sdkLoaded: cache.some((k) => /@opentelemetry[\\\\/](sdk-trace|exporter-trace|resources)/.test(k)),
      on: tracing.tracingOn(),
      provider: api?.trace !== undefined,
    }));
    process.exit(0);`;
  return new Promise((resolve, reject) => {
    const [cmd, args] = nodeCommand(['--input-type=module', '-e', script]);
    const child = spawn(cmd, args, { env: { PATH: process.env.PATH, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.on('error', reject);
    child.on('close', () => {
      try {
        resolve(JSON.parse(out) as { sdkLoaded: boolean; on: boolean; provider: boolean });
      } catch (err) {
        reject(new Error(`probe printed ${out}: ${String(err)}`));
      }
    });
  });
}

t.test('which environments turn tracing on', (t) => {
  t.equal(tracingConfigured({}), false, 'nothing set');
  t.equal(tracingConfigured({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on' }), false, 'no endpoint');
  t.equal(tracingConfigured({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318' }), true, 'the endpoint');
  t.equal(tracingConfigured({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c/v1/traces' }), true, 'the traces one');
  t.equal(tracingConfigured({ OTEL_EXPORTER_OTLP_ENDPOINT: ' ' }), false, 'blank');
  t.equal(
    tracingConfigured({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c', OTEL_SDK_DISABLED: 'true' }),
    false,
    'OTEL_SDK_DISABLED',
  );
  t.equal(
    tracingConfigured({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c', OTEL_TRACES_EXPORTER: 'none' }),
    false,
    'OTEL_TRACES_EXPORTER=none',
  );
  t.end();
});

t.test('off: the library loads no SDK and registers nothing; on: it does', async (t) => {
  t.same(await probe({}), { sdkLoaded: false, on: false, provider: false }, 'no variables: nothing loaded');
  t.same(
    await probe({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on' }),
    { sdkLoaded: false, on: false, provider: false },
    'OTEL variables without an endpoint: nothing loaded',
  );
  // A closed port: nothing is exported (the probe exits before the first batch), the SDK is still started.
  t.same(
    await probe({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:9' }),
    { sdkLoaded: true, on: true, provider: true },
    'an endpoint: the SDK loaded and registered',
  );
});

t.test('off in this process: every helper answers without a span', async (t) => {
  t.equal(tracingOn(), false);
  t.equal(startSpan('x', SpanKind.INTERNAL), undefined, 'no span');
  let attributesAsked = false;
  const r = await inSpan(
    'x',
    SpanKind.INTERNAL,
    () => {
      attributesAsked = true;
      return {};
    },
    (span) => Promise.resolve(span),
  );
  t.equal(r, undefined, 'inSpan runs its function without one');
  t.equal(attributesAsked, false, 'and never builds the attributes');
  t.equal(
    resumeSpan('p', SpanKind.CONSUMER, `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`, () => ({})),
    undefined,
  );
  t.equal(activeTraceContext(), null, 'nothing to store');
  const headers: Record<string, string> = {};
  injectContext(headers);
  t.same(headers, {}, 'no traceparent sent');
});

t.test('stored trace contexts', (t) => {
  const traceId = '0af7651916cd43dd8448eb211c80319c';
  const spanId = 'b7ad6b7169203331';
  const sc = parseTraceContext(`00-${traceId}-${spanId}-01\nvendor=opaque,other=x`);
  t.match(sc, { traceId, spanId, traceFlags: 1, isRemote: true });
  t.equal(sc?.traceState?.get('vendor'), 'opaque', 'the tracestate is kept');
  if (sc === null) throw new Error('not parsed');
  t.equal(formatTraceContext(sc), `00-${traceId}-${spanId}-01\nvendor=opaque,other=x`, 'formatted back');
  t.equal(parseTraceContext(`00-${traceId}-${spanId}-00`)?.traceFlags, 0, 'not sampled stays not sampled');
  t.equal(traceIdOf(`00-${traceId}-${spanId}-01`), traceId);
  for (const bad of [
    null,
    '',
    'garbage',
    `00-${'0'.repeat(32)}-${spanId}-01`,
    `00-${traceId}-${'0'.repeat(16)}-01`,
    `01-${traceId}-${spanId}-01`,
    `00-${traceId.toUpperCase()}-${spanId}-01`,
  ])
    t.equal(parseTraceContext(bad), null, `refused: ${JSON.stringify(bad)}`);
  t.end();
});

t.test('on: spans, the stored context, the resumed span and the log mixin', async (t) => {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register({ propagator: new W3CTraceContextPropagator() });
  t.teardown(() => provider.shutdown());
  enableTracing();
  t.equal(tracingOn(), true);

  const lines: Record<string, unknown>[] = [];
  const log = createLogger({
    level: 'info',
    name: 'test',
    destination: new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
        done();
      },
    }),
  });

  let stored: string | null = null;
  const sent: Record<string, string> = {};
  await inSpan(
    'outer',
    SpanKind.SERVER,
    () => ({ 'http.route': '/v1/calls' }),
    async (outer) => {
      await inSpan('inner', SpanKind.CLIENT, undefined, (inner) => {
        stored = activeTraceContext();
        injectContext(sent);
        log.info({ operation_id: 'op-1' }, 'inside');
        t.equal(inner?.spanContext().traceId, outer?.spanContext().traceId, 'one trace');
        return Promise.resolve();
      });
    },
  );
  log.info('outside');
  const spans = exporter.getFinishedSpans();
  const inner = spans.find((s) => s.name === 'inner');
  const outer = spans.find((s) => s.name === 'outer');
  t.equal(inner?.parentSpanContext?.spanId, outer?.spanContext().spanId, 'inner is the child of outer');
  t.match(outer?.attributes, { 'http.route': '/v1/calls' });
  if (inner === undefined) throw new Error('no inner span');
  t.equal(stored, formatTraceContext(inner.spanContext()), 'the stored context is the active span’s');
  t.equal(sent.traceparent, String(stored), 'the traceparent sent is the active span’s');
  t.match(lines[0], { msg: 'inside', trace_id: inner?.spanContext().traceId, span_id: inner?.spanContext().spanId });
  t.notOk('trace_id' in (lines[1] ?? {}), 'no ids outside a span');

  // Another process, later: the dispatcher's span continues the stored trace and links to it.
  const resumed = resumeSpan('process outbox', SpanKind.CONSUMER, stored, () => ({
    'messaging.operation.type': 'process',
  }));
  resumed?.end();
  const processSpan = exporter.getFinishedSpans().find((s) => s.name === 'process outbox');
  t.equal(processSpan?.spanContext().traceId, inner?.spanContext().traceId, 'same trace');
  t.equal(processSpan?.parentSpanContext?.spanId, inner?.spanContext().spanId, 'child of the stored context');
  t.same(
    processSpan?.links.map((l) => l.context.spanId),
    [inner?.spanContext().spanId],
    'linked to it',
  );
  const fresh = resumeSpan('process outbox', SpanKind.CONSUMER, null, () => ({}));
  t.not(fresh?.spanContext().traceId, inner?.spanContext().traceId, 'no stored context: a trace of its own');
  fresh?.end();
  // A stored context the caller did not sample, under the default parentbased sampler: nothing recorded.
  const quiet = resumeSpan(
    'process outbox',
    SpanKind.CONSUMER,
    `00-${'c'.repeat(32)}-${'d'.repeat(16)}-00`,
    () => ({}),
  );
  t.equal(quiet?.isRecording(), false, 'a stored context not sampled is not recorded');
});

t.test('a stored context never exceeds its column’s bound: a long tracestate is dropped', async (t) => {
  const { createTraceState, TraceFlags } = await import('@opentelemetry/api');
  const { TRACE_CONTEXT_MAX_BYTES } = await import('../../core/tracing.js');
  const sc = { traceId: 'a'.repeat(32), spanId: 'b'.repeat(16), traceFlags: TraceFlags.SAMPLED, isRemote: true };
  const short = formatTraceContext({ ...sc, traceState: createTraceState('vendor=x') });
  t.equal(short, `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01\nvendor=x`, 'a short one is kept');
  // The API's own TraceState caps what it parses; a propagator or library caller of another kind need not.
  const long = Array.from({ length: 10 }, (_, i) => `v${i}=${'z'.repeat(200)}`).join(',');
  const foreign = { ...createTraceState(), serialize: () => long };
  const stored = formatTraceContext({ ...sc, traceState: foreign });
  t.equal(stored, `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`, 'the traceparent alone');
  t.ok(Buffer.byteLength(stored) <= TRACE_CONTEXT_MAX_BYTES);
  t.equal(parseTraceContext(stored)?.traceId, 'a'.repeat(32), 'and it still parses');
});

t.test('flushTracing gives up on a collector that accepts and never answers', async (t) => {
  const { createServer } = await import('node:net');
  const held: import('node:net').Socket[] = [];
  const server = createServer((socket) => {
    held.push(socket);
    socket.resume();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of held) s.destroy();
    server.close();
  });
  const port = (server.address() as import('node:net').AddressInfo).port;
  const script = `
    const tracing = await import(${JSON.stringify(join(DIST, 'core', 'tracing.js'))});
    await tracing.startTracing(process.env, 'probe');
    await tracing.inSpan('probe', tracing.SpanKind.INTERNAL, undefined, async () => undefined);
    await tracing.flushTracing();
    process.stdout.write('flushed');
    process.exit(0);`;
  const [cmd, args] = nodeCommand(['--input-type=module', '-e', script]);
  const child = spawn(cmd, args, {
    env: {
      PATH: process.env.PATH,
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
      // The exporter alone would wait a minute for this collector.
      OTEL_EXPORTER_OTLP_TIMEOUT: '60000',
      OTEL_BSP_EXPORT_TIMEOUT: '60000',
    },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  const exited = await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), 20_000);
    child.on('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
  if (!exited) child.kill('SIGKILL');
  t.ok(held.length >= 1, 'the exporter reached the collector');
  t.ok(exited, 'the process exited while the collector still had not answered');
  t.equal(out, 'flushed', 'after its flush returned');
});

t.test('OTEL_TRACES_SAMPLER=traceidratio ignores a remote parent’s sampled flag', async (t) => {
  const { samplerFromEnv } = await import('../../core/tracing-sdk.js');
  const { ROOT_CONTEXT, SamplingDecision, trace, TraceFlags } = await import('@opentelemetry/api');
  const remote = (flags: number) =>
    trace.setSpanContext(ROOT_CONTEXT, {
      traceId: 'c'.repeat(32),
      spanId: 'd'.repeat(16),
      traceFlags: flags,
      isRemote: true,
    });
  const decide = (env: Record<string, string>, flags: number) =>
    samplerFromEnv(env).shouldSample(remote(flags), 'c'.repeat(32), 'POST /v1/calls', SpanKind.SERVER, {}, []).decision;
  const never = { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0' };
  t.equal(decide(never, TraceFlags.SAMPLED), SamplingDecision.NOT_RECORD, 'a caller cannot force sampling');
  const always = { OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '1' };
  t.equal(decide(always, TraceFlags.NONE), SamplingDecision.RECORD_AND_SAMPLED, 'nor suppress it');
  t.equal(decide({}, TraceFlags.SAMPLED), SamplingDecision.RECORD_AND_SAMPLED, 'the default follows the parent');
  t.equal(decide({}, TraceFlags.NONE), SamplingDecision.NOT_RECORD);
});
