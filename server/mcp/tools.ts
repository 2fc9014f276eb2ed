/**
 * How the gate's tools look to an MCP host: which are listed for a caller (the tenant's routed tools whose
 * roles include one of the caller's), the description the model reads (what the tool does, and the approvals,
 * confirmations and caps it may meet), the input schema (the tool's own strict schema, as configured) and the
 * annotations (`destructiveHint` for irreversible tools; `idempotentHint` always: the same step again is the
 * same operation). Also the few built-in tools that follow a call: confirm or cancel a proposal, read an
 * operation.
 */
import type { Config, GateCap, GateTool } from '../../config/index.js';
import type { GateResult } from '../../gate/index.js';

/** The MCP tool shape (the SDK's `Tool`, as far as this server fills it). */
export interface McpTool {
  name: string;
  title?: string;
  description: string;
  inputSchema: { type: 'object'; [k: string]: unknown };
  annotations: { readOnlyHint: boolean; destructiveHint: boolean; idempotentHint: boolean; openWorldHint: boolean };
}

/** The built-in tools' names; a configured gate tool of the same name takes precedence. */
export const BUILTIN = {
  confirm: 'actionledger_confirm_proposal',
  cancel: 'actionledger_cancel_proposal',
  operation: 'actionledger_operation',
} as const;

/** The URI of an operation's resource. */
export const operationUri = (id: string): string => `actionledger://operations/${id}`;
export const OPERATION_URI_TEMPLATE = 'actionledger://operations/{operation_id}';

function capText(name: string, cap: GateCap | null): string | null {
  if (cap === null) return null;
  const parts = [
    cap.maxCount === null ? null : `${cap.maxCount} calls`,
    cap.maxValue === null ? null : `a value of ${cap.maxValue}`,
  ].filter((p) => p !== null);
  return parts.length === 0 ? null : `at most ${parts.join(' and ')} ${name}`;
}

/** What the model is told about a gate tool besides its own description. */
export function describeTool(t: GateTool): string {
  const lines = [t.description.trim() === '' ? `Calls ${t.name}.` : t.description.trim()];
  const a = t.approval;
  const who = t.approval.approvers === 1 ? 'a person' : `${a.approvers} people`;
  if (a.mode === 'always') lines.push(`Every call needs approval by ${who} before it happens (approval_required).`);
  if (a.mode === 'threshold' && a.threshold !== null)
    lines.push(
      `A call above ${a.threshold}${t.value?.limitsCurrency == null ? '' : ` ${t.value.limitsCurrency}`} needs approval by ${who} (approval_required).`,
    );
  if (a.mode === 'confirm')
    lines.push("Every call needs the user's confirmation of the exact arguments (confirmation_required).");
  const caps = [
    capText('per conversation', t.limits.perConversation),
    capText('per principal per day', t.limits.perPrincipalDay),
    capText('per account per day', t.limits.perAccountDay),
  ].filter((c) => c !== null);
  if (caps.length > 0) lines.push(`Limits: ${caps.join('; ')} (limit_exceeded beyond them).`);
  if (t.rate !== null) lines.push(`Rate: ${t.rate.limit} calls per ${t.rate.windowS} s (rate_limited).`);
  if (t.irreversible) lines.push('Irreversible: it cannot be undone once it happened.');
  lines.push(
    'Calling the same workflow step again returns the same operation. A refusal is a tool error with a stable code: read it and tell the user; do not retry with other arguments to get around it.',
  );
  return lines.join('\n');
}

/** Whether the tool is routed for the tenant and one of `roles` may call it. */
export function visible(config: Config, t: GateTool, tenant: string, roles: readonly string[]): boolean {
  const route = config.tools.get(t.name);
  return route !== undefined && route.allowedTenants.has(tenant) && roles.some((r) => t.roles.has(r));
}

/** The gate tools `roles` may call in `tenant`, as MCP tools, in name order. */
export function gateTools(config: Config, tenant: string, roles: readonly string[]): McpTool[] {
  return [...config.gate.tools.values()]
    .filter((t) => visible(config, t, tenant, roles))
    .sort((x, y) => (x.name < y.name ? -1 : 1))
    .map((t) => ({
      name: t.name,
      description: describeTool(t),
      inputSchema: t.schema as McpTool['inputSchema'],
      annotations: { readOnlyHint: false, destructiveHint: t.irreversible, idempotentHint: true, openWorldHint: true },
    }));
}

const proposalIdentity = 'The host’s metadata (task, step, turn) applies as for any call.';

/** The built-in tools, listed when one of `roles` may call some gate tool in the tenant. */
export function builtinTools(config: Config, tenant: string, roles: readonly string[]): McpTool[] {
  if (![...config.gate.tools.values()].some((t) => visible(config, t, tenant, roles))) return [];
  const strict = (properties: Record<string, unknown>, required: string[]): McpTool['inputSchema'] => ({
    type: 'object',
    additionalProperties: false,
    required,
    properties,
  });
  const id = { type: 'string', minLength: 1, maxLength: 256 };
  const tools: McpTool[] = [
    {
      name: BUILTIN.confirm,
      description: `Carries out a proposal the user confirmed: use the confirm_token of a confirmation_required answer, only after the user said yes in a later turn (the same turn is refused, proposal_same_turn_confirm; a call without the host's turn is refused, invalid_context). It runs the stored arguments, never new ones. ${proposalIdentity}`,
      inputSchema: strict({ confirm_token: id }, ['confirm_token']),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: true },
    },
    {
      name: BUILTIN.cancel,
      description: `Cancels a proposal (the request_id of a confirmation_required answer) the user declined. ${proposalIdentity}`,
      inputSchema: strict({ request_id: id }, ['request_id']),
      annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    },
    {
      name: BUILTIN.operation,
      description: `Reads an operation a call reserved (its operation_id): its state (pending, executing, succeeded, unknown, needs_review, failed, ...), the provider's receipt once it succeeded, and its history. Also a resource: ${OPERATION_URI_TEMPLATE}.`,
      inputSchema: strict({ operation_id: id }, ['operation_id']),
      annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    },
  ];
  return tools.filter((b) => !config.gate.tools.has(b.name));
}

/** The MCP result of a gate answer: structured content the model reads; a refusal or hold is a tool error. */
export function toolResult(result: GateResult | Record<string, unknown>): {
  content: { type: 'text'; text: string }[];
  structuredContent: Record<string, unknown>;
  isError: boolean;
} {
  const structured: Record<string, unknown> = { ...result };
  const opId = structured.operation_id;
  if (typeof opId === 'string') structured.operation_uri = operationUri(opId);
  const failed = structured.ok === false;
  const head = failed ? `${String(structured.error)}: ${String(structured.message)}` : String(structured.message);
  return {
    content: [{ type: 'text', text: `${head}\n${JSON.stringify(structured)}` }],
    structuredContent: structured,
    isError: failed,
  };
}
