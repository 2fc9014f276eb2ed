/**
 * The OpenTelemetry SDK, loaded by core/tracing.ts's `startTracing` only when the environment names an OTLP
 * endpoint: a Node tracer provider (async-local context, W3C trace context propagation, no baggage), the sampler
 * that `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` name, and a batch processor exporting OTLP/HTTP JSON to
 * the endpoint (the exporter reads `OTEL_EXPORTER_OTLP_*` itself: endpoint, headers, timeout). Nothing imports this
 * file statically, so a process without the variables never loads the SDK.
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { diag, DiagLogLevel } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  NodeTracerProvider,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type Sampler,
} from '@opentelemetry/sdk-trace-node';
import type { TracingSdk } from './tracing.js';

/** The sampler `OTEL_TRACES_SAMPLER` names (the specification's values); parentbased_always_on by default. */
export function samplerFromEnv(env: NodeJS.ProcessEnv): Sampler {
  const name = (env.OTEL_TRACES_SAMPLER ?? '').trim().toLowerCase() || 'parentbased_always_on';
  const arg = Number((env.OTEL_TRACES_SAMPLER_ARG ?? '').trim() || '1');
  const ratio = Number.isFinite(arg) && arg >= 0 && arg <= 1 ? arg : 1;
  switch (name) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(ratio);
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
    default:
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
  }
}

export function startSdk(env: NodeJS.ProcessEnv, part: string): TracingSdk {
  // The SDK's own complaints (an exporter that cannot reach its collector) as single lines on stderr, warnings up;
  // one logger, also when the SDK is started again in one process (the benchmark's alternating cells).
  diag.disable();
  diag.setLogger(
    {
      error: (m) => process.stderr.write(`opentelemetry: ${m}\n`),
      warn: (m) => process.stderr.write(`opentelemetry: ${m}\n`),
      info: () => undefined,
      debug: () => undefined,
      verbose: () => undefined,
    },
    DiagLogLevel.WARN,
  );
  const detected = detectResources({ detectors: [envDetector] });
  const resource = resourceFromAttributes({
    'service.name': 'actionledger',
    'service.instance.id': randomUUID(),
    'host.name': hostname(),
    'process.pid': process.pid,
    'actionledger.process': part,
  }).merge(detected);
  const provider = new NodeTracerProvider({
    resource,
    sampler: samplerFromEnv(env),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  });
  provider.register({ propagator: new W3CTraceContextPropagator() });
  return {
    flush: () => provider.forceFlush(),
    shutdown: () => provider.shutdown(),
  };
}
