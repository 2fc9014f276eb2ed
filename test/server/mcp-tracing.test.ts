/**
 * With tracing on, an MCP tool call over Streamable HTTP continues the request's `traceparent`: the `POST /mcp`
 * server span is the caller's span's child, and the gate's decision and the reservation of the call are in that
 * request's span. Spans are recorded in this process by the SDK's in-memory exporter; the API is built after
 * tracing is enabled, as the service builds it.
 */
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { apiFixture } from '../helpers/api.js';
import { call, meta } from '../helpers/mcp.js';
import { traceInMemory } from '../helpers/tracing.js';

t.test('an MCP tool call over HTTP is in the caller’s trace', async (t) => {
  const exporter = traceInMemory(t);
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const traceId = randomBytes(16).toString('hex');
  const callerSpan = randomBytes(8).toString('hex');
  const client = new Client({ name: 'actionledger-test-host', version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(`${f.base}/mcp`), {
    requestInit: {
      headers: {
        authorization: `Bearer ${token}`,
        traceparent: `00-${traceId}-${callerSpan}-01`,
        tracestate: 'caller=controlled',
      },
    },
  });
  await client.connect(transport);
  t.teardown(() => client.close());

  const r = await call(client, 'transfer_funds', { to_account: 'ACC0000000001', amount: 5 }, meta('traced'));
  t.match(r, { isError: false, body: { ok: true, status: 'reserved' } });

  const spans = exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === traceId);
  const requests = spans.filter((s) => s.name === 'POST /mcp');
  t.ok(requests.length >= 1, 'the MCP requests’ server spans');
  for (const s of requests) t.equal(s.parentSpanContext?.spanId, callerSpan, 'each the caller’s span’s child');
  const gate = spans.find((s) => s.name === 'gate transfer_funds');
  t.ok(
    requests.some((s) => s.spanContext().spanId === gate?.parentSpanContext?.spanId),
    'the gate’s decision is the tool call request’s child',
  );
  t.match(gate?.attributes, { 'actionledger.decision': 'allowed' });
  const reserve = spans.find((s) => s.name === 'reserve');
  t.equal(reserve?.parentSpanContext?.spanId, gate?.spanContext().spanId, 'the reservation is the decision’s child');
  // The caller's tracestate is dropped at the edge: in no span, and not stored to be sent on.
  t.ok(
    spans.every((s) => s.spanContext().traceState === undefined || s.spanContext().traceState?.serialize() === ''),
    'no span carries the caller’s tracestate',
  );
  const { rows } = await f.pool.query<{ trace_context: string | null }>(
    'SELECT trace_context FROM actionledger.operations',
  );
  t.equal(rows.length, 1);
  t.match(rows[0]?.trace_context, new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`), 'the traceparent alone is stored');
});
