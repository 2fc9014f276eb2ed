/**
 * Tracing on in this process for one test, into memory: a tracer provider registered with the W3C propagator,
 * the library's hooks enabled, and both undone at the test's end. The spans are read from the exporter returned.
 * (Tests that check the SDK stays unloaded import it on their own, later, instead.)
 */
import type { Test } from 'tap';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import { disableTracing, enableTracing } from '../../core/tracing.js';

export function traceInMemory(t: Test): InMemorySpanExporter {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register({ propagator: new W3CTraceContextPropagator() });
  enableTracing();
  t.teardown(async () => {
    disableTracing();
    await provider.shutdown();
  });
  return exporter;
}
