/**
 * MCP clients for tests: the SDK's own `Client` over its Streamable HTTP transport against the API's listener
 * (a bearer token in every request's headers), optionally declaring elicitation and answering it. Also the
 * gate-behind-a-dispatcher environment the effect tests need: the API fixture on the predispatch database,
 * its tools routed to the sandbox provider, and the built-in authorization service.
 */
import type { Test } from 'tap';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, type ElicitRequest, type ElicitResult } from '@modelcontextprotocol/sdk/types.js';
import { AuthorizationService } from '../../gate/index.js';
import { apiFixture, type ApiFixture } from './api.js';
import { settled } from './fleet.js';
import { GATE_RESOLVERS, gateRoutes } from './gate.js';
import { predispatchEnv, type PredispatchEnv } from './predispatch-env.js';

export interface McpClientOptions {
  /** Declares the elicitation capability and answers each request with this. */
  elicit?: (request: ElicitRequest['params']) => ElicitResult | Promise<ElicitResult>;
}

/** A connected SDK client (closed at teardown); rejects when the server refuses the connection. */
export async function mcpClient(
  t: Test,
  base: string,
  token: string | undefined,
  options: McpClientOptions = {},
): Promise<Client> {
  const client = new Client(
    { name: 'actionledger-test-host', version: '1.0.0' },
    { capabilities: options.elicit === undefined ? {} : { elicitation: { form: {} } } },
  );
  const elicit = options.elicit;
  if (elicit !== undefined) client.setRequestHandler(ElicitRequestSchema, (request) => elicit(request.params));
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  t.teardown(() => client.close());
  return client;
}

/** The `_meta` a host sets on a call: task and step, and the rest given. */
export function meta(step: string, over: Record<string, unknown> = {}): Record<string, unknown> {
  const out: Record<string, unknown> = { 'actionledger/task_id': 'task-1', 'actionledger/workflow_step_id': step };
  for (const [k, v] of Object.entries(over)) out[`actionledger/${k}`] = v;
  return out;
}

/** A tool call's structured content and whether it was a tool error. */
export async function call(
  client: Client,
  name: string,
  args: Record<string, unknown>,
  m: Record<string, unknown>,
): Promise<{ isError: boolean; body: Record<string, unknown> }> {
  const r = await client.callTool({ name, arguments: args, _meta: m });
  return { isError: r.isError === true, body: (r.structuredContent ?? {}) as Record<string, unknown> };
}

export interface McpDispatchEnv {
  e: PredispatchEnv;
  f: ApiFixture;
  /** Runs a dispatcher against the authorization service until `operationId` settles; returns the row. */
  dispatch: (operationId: string) => Promise<Awaited<ReturnType<typeof settled>>>;
}

/** The API (and so /mcp) over the predispatch database, its tools routed to the sandbox provider. */
export async function mcpDispatchEnv(t: Test): Promise<McpDispatchEnv> {
  const e = await predispatchEnv(t);
  const f = await apiFixture(t, { url: e.url, pool: e.pool, endpoint: e.provider.endpoint });
  const service = new AuthorizationService({
    config: f.config,
    pool: e.pool,
    resolvers: GATE_RESOLVERS,
    tls: { ...e.pki.server, ca: e.pki.ca.cert },
  });
  t.teardown(() => service.stop());
  await service.start();
  return {
    e,
    f,
    async dispatch(operationId) {
      const d = await e.open({ tools: gateRoutes(e.provider.endpoint), authorizationUrl: service.authorizeUrl });
      try {
        return await settled(e.pool, operationId);
      } finally {
        await d.stop();
      }
    },
  };
}
