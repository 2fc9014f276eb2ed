-- actionledger 0020: the trace context an operation was reserved under.
--
-- With tracing on (an OTLP endpoint configured, docs/observability.md), a reservation stores the W3C `traceparent`
-- of the span it ran in, and its `tracestate` after a newline, so the dispatcher that claims the operation (another
-- process, maybe minutes later) continues that trace, and the reconciler, review actions and compensations link to
-- it. Only those two header values, never anything else of the request. NULL with tracing off, and for operations
-- reserved before this migration: a nullable column without a default is added without rewriting the table, and
-- stays out of every index.
--
-- The bound is added NOT VALID: a CHECK added with the column (or validated) scans the whole table under the
-- ACCESS EXCLUSIVE lock the ALTER holds, every reservation waiting for it. Every existing row is NULL, which the
-- CHECK accepts, so there is nothing to validate; every row inserted or updated from now on is checked.
ALTER TABLE operations ADD COLUMN trace_context text;
ALTER TABLE operations ADD CONSTRAINT operations_trace_context_bounded
  CHECK (octet_length(trace_context) <= 1024) NOT VALID;
