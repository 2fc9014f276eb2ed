/**
 * The gate as a Model Context Protocol server (the official SDK's low-level `Server`), one per MCP session,
 * over any transport: Streamable HTTP on the service's listener (server/mcp/http.ts) or stdio
 * (`actionledger mcp --stdio`). Every request authenticates its caller again (`McpDeps.caller`), so an expired
 * token or a revoked role stops the next request of a session that is already open.
 *
 *   tools/list      the gate tools the caller's tenant routes and its roles may call, with the built-ins
 *   tools/call      Gate.call with the context of server/mcp/context.ts; the gate's answer as structured
 *                   content, a refusal or hold as a tool error (isError) with its code, never a protocol error
 *                   confirmation_required + client elicitation: ask the user, then Gate.confirm (a turn of its
 *                   own) and Gate.executeProposal with the arguments the user saw, compared by hash; hidden
 *                   characters shown as codes and acknowledged apart (server/mcp/confirm.ts)
 *   resources/read  actionledger://operations/{id}: the operation's state, receipt and history
 */
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js';
import {
  CallToolRequestSchema,
  ErrorCode as McpErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  ReadResourceRequestSchema,
  type ServerNotification,
  type ServerRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { ActionLedgerError, asActionLedgerError, ERROR_CODES, type ErrorCode } from '../../core/errors.js';
import { DEFAULT_RETRY_AFTER_S } from '../api/errors.js';
import type { GateContext, GateResult } from '../../gate/index.js';
import { TenantLedgerView } from '../../ledger/index.js';
import type { Authenticated } from '../../principals/index.js';
import { overWindow } from '../api/auth.js';
import type { ApiDeps } from '../api/types.js';
import { confirmAndExecute, elicitConfirmation } from './confirm.js';
import { actingPrincipal, callContext, listingRoles, type Meta } from './context.js';
import {
  BUILTIN,
  builtinTools,
  gateTools,
  OPERATION_URI_TEMPLATE,
  operationUri,
  toolResult,
  visible,
} from './tools.js';

export type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** What the MCP server needs: the API's dependencies, and who is calling on this request. */
export interface McpDeps extends Pick<ApiDeps, 'config' | 'pool' | 'gate' | 'audit' | 'log' | 'metrics' | 'writes'> {
  /**
   * The caller of this request, authenticated when it arrived; with `again`, authenticated once more now (for a
   * request that waited on the user). Throws `unauthenticated`.
   */
  caller(extra: Extra, again?: boolean): Promise<Authenticated>;
}

export const SERVER_INFO = { name: 'actionledger', version: '1' } as const;

const INSTRUCTIONS =
  'Each tool is a state-changing action run through a gate: it may be refused (a tool error with a stable code), held for a person’s approval (approval_required), or need the user’s confirmation (confirmation_required). Never retry a refusal with other arguments to get around it; tell the user what the code says. A result names its operation: read actionledger_operation or the resource actionledger://operations/{id} to follow it.';

/** A new MCP server over the gate (connect it to one transport). */
export function createMcpServer(deps: McpDeps): Server {
  const server = new Server(SERVER_INFO, {
    capabilities: { tools: { listChanged: false }, resources: {} },
    instructions: INSTRUCTIONS,
  });
  server.setRequestHandler(ListToolsRequestSchema, async (request, extra) => {
    const caller = await deps.caller(extra).catch(protocolError);
    let roles: string[];
    try {
      withinWindow(deps, caller);
      roles = listingRoles(deps.config, caller, request.params?._meta);
    } catch (err) {
      protocolError(err);
    }
    return {
      tools: [
        ...gateTools(deps.config, caller.tenant_id, roles),
        ...builtinTools(deps.config, caller.tenant_id, roles),
      ],
    };
  });
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    // Over HTTP the trace id is the request's id (its x-request-id): the audit rows and the answer meet there.
    const fromRequest = extra.authInfo?.extra?.request_id;
    const trace = typeof fromRequest === 'string' ? fromRequest : randomUUID();
    const { name, arguments: args } = request.params;
    const meta = request.params._meta;
    // Not authenticated now (the token expired or was revoked mid-session): the request itself is refused.
    const caller = await deps.caller(extra).catch(protocolError);
    try {
      withinWindow(deps, caller);
      const r = await callTool(server, deps, caller, name, args ?? {}, meta, trace, extra);
      return toolResult(failureSeen(deps, r));
    } catch (err) {
      const e = asActionLedgerError(err);
      // Anything unexpected stays in the log; the model reads only its code.
      if (e.code === 'internal') deps.log.error({ err, trace_id: trace, tool: name }, 'MCP tool call failed');
      const message = e.code === 'internal' ? 'internal error' : e.message;
      const refusal = { ok: false as const, error: e.code, message, ...detailsOf(e.details) };
      await deps.audit.after({
        action: 'api',
        outcome: e.code,
        context: { tenant_id: caller.tenant_id, principal_id: caller.principal_id, trace_id: trace },
        tool: deps.gate.tool(name) === undefined ? null : name,
        detail: { surface: 'mcp', method: 'tools/call', message },
      });
      return toolResult(refusal);
    }
  });
  server.setRequestHandler(ListResourcesRequestSchema, () => ({ resources: [] }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({
    resourceTemplates: [
      {
        uriTemplate: OPERATION_URI_TEMPLATE,
        name: 'operation',
        description: 'An operation a tool call reserved: its state, receipt and history',
        mimeType: 'application/json',
      },
    ],
  }));
  server.setRequestHandler(ReadResourceRequestSchema, async (request, extra) => {
    const caller = await deps.caller(extra).catch(protocolError);
    const m = /^actionledger:\/\/operations\/([^/?#]+)$/.exec(request.params.uri);
    let found: Record<string, unknown> | null = null;
    try {
      withinWindow(deps, caller);
      if (m !== null) found = await readOperation(deps, caller, m[1] ?? '', request.params._meta);
    } catch (err) {
      protocolError(err);
    }
    if (found === null || !found.ok)
      throw rpcError(McpErrorCode.InvalidParams, 'not_found: no such resource', { error: 'not_found' });
    return {
      contents: [{ uri: request.params.uri, mimeType: 'application/json', text: JSON.stringify(found) }],
    };
  });
  return server;
}

/**
 * A gate result that is a database failure rather than a decision (`storage_full`, `database_read_only`, ...)
 * stays a tool error, so the model reads its code, with `retry_after_s` added; a write refusal is reported to
 * the write health, so `/readyz` turns 503 at once, as it does for the API's writes.
 */
function failureSeen(
  deps: McpDeps,
  result: GateResult | Record<string, unknown>,
): GateResult | Record<string, unknown> {
  const r = result as Record<string, unknown>;
  const code = r.ok === false && typeof r.error === 'string' ? (r.error as ErrorCode) : undefined;
  if (code === undefined || ERROR_CODES[code] !== 'retryable') return result;
  deps.writes?.report(new ActionLedgerError(code, String(r.message)));
  return r.retry_after_s === undefined
    ? { ...r, retry_after_s: deps.writes?.retryAfterS ?? DEFAULT_RETRY_AFTER_S }
    : result;
}

/**
 * Throws `rate_limited` (with `retry_after_s`) when the caller's request window holds more than the API's
 * limit. Over HTTP the API's hook has refused such a request already; over stdio this is the one check, so a
 * model looping on the stdio server is held to the same window as the token's HTTP requests.
 */
function withinWindow(deps: McpDeps, caller: Authenticated): void {
  const over = overWindow(deps, caller);
  if (over !== null) throw over;
}

/**
 * A caller's error outside a tool's result (listing, reading, authenticating): a JSON-RPC error whose message
 * starts with the stable code, which is also its `data.error` (and its details, `retry_after_s` for one, in
 * `data.details`).
 */
function protocolError(err: unknown): never {
  const e = asActionLedgerError(err);
  if (e.code === 'internal') throw rpcError(McpErrorCode.InternalError, 'internal: internal error', { error: e.code });
  throw rpcError(McpErrorCode.InvalidParams, `${e.code}: ${e.message}`, {
    error: e.code,
    ...(e.details === undefined ? {} : { details: e.details }),
  });
}

/**
 * A JSON-RPC error as the SDK sends it (its `code`, `message` and `data`). Not the SDK's `McpError`: that one
 * puts `MCP error -32602: ` before the message it sends, and the client's SDK puts it there again.
 */
function rpcError(code: number, message: string, data: Record<string, unknown>): Error {
  return Object.assign(new Error(message), { code, data });
}

function detailsOf(details: Record<string, unknown> | undefined): { details?: Record<string, unknown> } {
  return details === undefined ? {} : { details };
}

/** One tools/call: a built-in, or a gate tool through the whole pipeline. Throws coded errors (a tool error). */
async function callTool(
  server: Server,
  deps: McpDeps,
  caller: Authenticated,
  name: string,
  args: Record<string, unknown>,
  meta: Meta,
  trace: string,
  extra: Extra,
): Promise<GateResult | Record<string, unknown>> {
  const roleVisible = (roles: readonly string[]) =>
    [...deps.config.gate.tools.values()].some((t) => visible(deps.config, t, caller.tenant_id, roles));
  if (name === BUILTIN.operation && !deps.config.gate.tools.has(name)) {
    if (!roleVisible(listingRoles(deps.config, caller, meta))) return unknownTool(name);
    const id = args.operation_id;
    return (await readOperation(deps, caller, typeof id === 'string' ? id : '', meta)) ?? unknownTool(name);
  }
  // The built-in confirm needs the host's turn: defaulting to the request id would make every request a turn
  // of its own, so the model could confirm its own proposal in its next call without the user.
  const confirming = name === BUILTIN.confirm && !deps.config.gate.tools.has(name);
  const context = callContext(deps.config, caller, meta, trace, { hostTurn: confirming });
  if ((name === BUILTIN.confirm || name === BUILTIN.cancel) && !deps.config.gate.tools.has(name)) {
    if (!roleVisible([context.role])) return unknownTool(name);
    if (name === BUILTIN.cancel)
      return deps.gate.cancelProposal(typeof args.request_id === 'string' ? args.request_id : '', context);
    return confirmAndExecute(
      deps,
      typeof args.confirm_token === 'string' ? args.confirm_token : '',
      context,
      undefined,
    );
  }
  const result = await deps.gate.call(context, name, args);
  deps.metrics?.gateCalls.inc({
    tool: deps.gate.tool(name) === undefined ? 'unknown' : name,
    outcome: result.ok ? 'allowed' : result.error,
  });
  if (result.ok) return result;
  if (result.error === 'approval_required' && result.request_id !== undefined) {
    const view = await deps.gate.approvals.show(result.request_id, { tenant_id: context.tenant_id }).catch(() => null);
    if (view === null) return result;
    return { ...result, envelope_sha256: view.envelope_sha256, approval: { shown_to_approvers: view.envelope } };
  }
  if (result.error === 'confirmation_required' && server.getClientCapabilities()?.elicitation !== undefined) {
    // The user may answer long after the call arrived: the caller is authenticated again and the context rebuilt
    // from what holds then (a revoked token, role or act_for_users stops the confirmation).
    const recheck = async (): Promise<GateContext> => {
      const now = callContext(deps.config, await deps.caller(extra, true), meta, trace);
      if (now.principal_id !== context.principal_id || now.role !== context.role)
        throw new ActionLedgerError('permission_denied', 'the caller no longer acts with the role it called with', {
          details: { role: context.role },
        });
      return now;
    };
    return elicitConfirmation(deps, context, recheck, name, args, result, extra);
  }
  return result;
}

function unknownTool(name: string): GateResult {
  return { ok: false, error: 'unknown_tool', message: `there is no tool named ${JSON.stringify(name.slice(0, 64))}` };
}

/** An operation of the caller's tenant, if it may read it: capability read, or its own principal's. */
async function readOperation(
  deps: McpDeps,
  caller: Authenticated,
  id: string,
  meta: Meta | Record<string, unknown> | undefined,
): Promise<Record<string, unknown> | null> {
  const view = new TenantLedgerView(deps.pool, deps.config.schemaQuoted);
  const notFound = { ok: false, error: 'not_found', message: 'no such operation' };
  let found;
  try {
    found = await view.show(caller.tenant_id, id);
  } catch (err) {
    const e = asActionLedgerError(err);
    if (e.code === 'not_found') return notFound;
    throw e;
  }
  const reader = caller.roles.some((r) => deps.config.api.permissions.read.has(r));
  const principal = actingPrincipal(deps.config, caller, meta);
  if (!reader && found.operation.principal_id !== principal) return notFound;
  const o = found.operation;
  return {
    ok: true,
    message: `operation ${String(o.operation_id)} is ${String(o.status)}`,
    operation_id: o.operation_id,
    operation_uri: operationUri(String(o.operation_id)),
    tool: o.tool_name,
    status: o.status,
    receipt: o.provider_receipt ?? null,
    review_reason: o.review_reason ?? null,
    attempt: o.attempt,
    created_at: o.created_at,
    updated_at: o.updated_at,
    history: found.history,
  };
}
