-- actionledger 0020: the trace context an operation was reserved under.
--
-- With tracing on (an OTLP endpoint configured, docs/observability.md), a reservation stores the W3C `traceparent`
-- of the span it ran in, and its `tracestate` after a newline, so the dispatcher that claims the operation (another
-- process, maybe minutes later) continues that trace, and the reconciler, review actions and compensations link to
-- it. Only those two header values, never anything else of the request. NULL with tracing off, and for operations
-- reserved before this migration: a nullable column without a default is added without rewriting the table, and
-- stays out of every index.
ALTER TABLE operations ADD COLUMN trace_context text
  CONSTRAINT operations_trace_context_bounded CHECK (octet_length(trace_context) <= 1024);
