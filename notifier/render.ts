/**
 * What a notification says: the event as the JSON a webhook receives, and as the Slack message a person reads.
 * Both show what the console shows: the envelope with the tool's `redact` keys replaced (the same copy the
 * audit log keeps, the effect in words said again from that copy), never a credential. Arguments the tool no longer declares (the tool was removed from the
 * configuration) are left out whole: without a redaction policy nothing of them is shown.
 */
import type { Config, GateTool } from '../config/index.js';
import type { NotificationEventType } from '../config/index.js';
import type { JsonObject, JsonValue } from '../core/json.js';
import { foundInWords, hiddenInJson, revealHidden, visibleJson } from '../core/visible-text.js';
import { auditArguments, describeEffect, REDACTED } from '../gate/index.js';

/** A JSON value as text: strings as they are, anything else as its JSON. */
export function txt(v: unknown): string {
  return typeof v === 'string' ? v : (JSON.stringify(v) ?? 'null');
}

/** One event as claimed for delivery. */
export interface ClaimedEvent {
  event_id: string;
  destination: string;
  attempts: number;
  event_type: NotificationEventType;
  tenant_id: string;
  tool_name: string | null;
  subject_id: string;
  payload: JsonObject;
  created_at: Date;
  /** The database clock when the delivery was claimed (seconds), for time left. */
  now_s: number;
}

/** The event's data as a receiver sees it: envelope arguments redacted, time left added to open approvals. */
export function eventData(config: Config, e: ClaimedEvent): JsonObject {
  const data: JsonObject = { ...e.payload };
  const envelope = data.envelope;
  if (envelope !== null && typeof envelope === 'object' && !Array.isArray(envelope)) {
    const tool = config.gate.tools.get(txt(envelope.tool));
    const shown = auditArguments(tool, envelope.arguments, config.argumentBounds).value as JsonObject | null;
    // The effect in words quotes arguments too: said again from the redacted copy (or not at all).
    const effect = tool === undefined || shown === null ? null : describeEffect(tool, shown);
    // Left out: the arguments' own hash and the envelope's salt, with which a guess of a redacted value could
    // be confirmed (the envelope hash alone cannot be recomputed without the salt).
    const rest: JsonObject = { ...envelope };
    delete rest.args_sha256;
    delete rest.salt;
    data.envelope = { ...rest, arguments: shown, effect, resources: shownResources(tool, rest.resources) };
  }
  if (e.event_type === 'approval.requested' && typeof data.expires_at === 'string')
    data.time_left_s = Math.max(0, Math.floor(Date.parse(data.expires_at) / 1000 - e.now_s));
  return data;
}

/**
 * The bound resources as a receiver sees them: the id of a resource named by a redacted argument replaced by
 * "[redacted]" (so is every id when the tool, and with it the redaction policy, is no longer configured).
 */
function shownResources(tool: GateTool | undefined, resources: JsonValue | undefined): JsonValue {
  if (!Array.isArray(resources)) return [];
  return resources.map((r, i) => {
    if (r === null || typeof r !== 'object' || Array.isArray(r)) return { id: REDACTED };
    const bound = tool?.resources[i];
    const hidden = bound === undefined || bound.type !== r.type || tool?.redact.has(bound.idArgument) !== false;
    return hidden ? { ...r, id: REDACTED } : r;
  });
}

/**
 * The webhook body (Standard Webhooks' recommended shape: type, timestamp, data). A receiver that shows it to a
 * person sees no hidden character drawn: each is written as its JSON escape (the same value to a parser), and
 * `data.hidden_characters` lists each one's code and JSON pointer when there are any, and each string holding
 * right-to-left text (class `right_to_left`), which a receiver's screen would reorder.
 */
export function webhookBody(config: Config, e: ClaimedEvent): string {
  const data = eventData(config, e);
  const hidden = hiddenInJson(data);
  if (hidden.length > 0) data.hidden_characters = hidden.map((h) => ({ ...h }));
  return visibleJson({
    type: e.event_type,
    timestamp: e.created_at.toISOString(),
    tenant_id: e.tenant_id,
    data,
  });
}

/**
 * Slack mrkdwn text: `&`, `<` and `>` escaped as Slack asks, so nothing in it becomes a link or mention, and
 * each character a reader would not see as written (core/visible-text.ts) shown as its code, `\u202E`.
 */
export function slackText(s: string): string {
  return revealHidden(s).replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;');
}

/** Slack plain text (a header): each hidden character as its code; Slack escapes nothing else there. */
function slackPlain(s: string): string {
  return revealHidden(s);
}

/**
 * JSON for a Slack code block: pretty, each hidden character written as its JSON escape (the same value, drawn
 * as its code), and no backtick can end the block early (written as its escape).
 */
function codeJson(v: unknown): string {
  return slackText(visibleJson(v, 2).replaceAll('`', '\\u0060'));
}

/** Slack section texts are capped at 3000 characters; longer arguments are not shown, and not approvable here. */
const MAX_CODE = 2800;

export const APPROVE_ACTION = 'actionledger_approve';
export const REJECT_ACTION = 'actionledger_reject';

type Block = Record<string, unknown>;
const section = (text: string): Block => ({ type: 'section', text: { type: 'mrkdwn', text } });

/** The approval request as a Slack message: effect, requester, exact arguments, resources, time left, buttons. */
export function slackApprovalRequest(config: Config, e: ClaimedEvent): { text: string; blocks: Block[] } {
  const data = eventData(config, e);
  const env = (data.envelope ?? {}) as JsonObject;
  const tool = txt(data.tool);
  const approvalId = txt(data.approval_id);
  const hash = txt(data.envelope_sha256);
  const minutes = Math.ceil(Number(data.time_left_s ?? 0) / 60);
  const code = codeJson(env.arguments ?? null);
  const resources = Array.isArray(env.resources) ? (env.resources as JsonObject[]) : [];
  // The person is asked about the whole event as shown, the requester's names included.
  const hidden = hiddenInJson(data);
  const text = slackPlain(`Approval needed: ${tool} requested by ${txt(data.requester_id)} (${minutes} min left)`);
  const blocks: Block[] = [
    { type: 'header', text: { type: 'plain_text', text: slackPlain(`Approval needed: ${tool}`).slice(0, 150) } },
    section(
      [
        typeof env.effect === 'string' ? `*${slackText(env.effect)}*` : null,
        `Requested by \`${slackText(txt(data.requester_id))}\` (role \`${slackText(txt(data.requester_role))}\`)`,
        `Approvers needed: ${txt(data.required_approvals)} · Time left: *${minutes} min* (expires ${slackText(txt(data.expires_at))})`,
      ]
        .filter((l) => l !== null)
        .join('\n'),
    ),
    ...(hidden.length === 0
      ? []
      : [
          section(
            `:warning: *Hidden characters*: what you are asked to approve holds ${hidden.length} place(s) a screen would not draw as stored: characters drawn as nothing or blank, that reorder the text around them or strike through it (each shown below as its code), or text written right to left, which reorders the digits and words around it (${slackText(
              foundInWords(hidden, 5),
            )}). Approving it is not offered here: decide in the console, which shows it in the order it is stored.`,
          ),
        ]),
    code.length <= MAX_CODE
      ? section(`*Arguments*\n\`\`\`${code}\`\`\``)
      : section('*Arguments* are too long to show here: review and decide in the console.'),
    section(
      `*Resources*\n${
        resources.length === 0
          ? 'none bound'
          : resources
              .map(
                (r) =>
                  `• ${slackText(txt(r.type))} \`${slackText(txt(r.id))}\` at version \`${slackText(txt(r.version))}\``,
              )
              .join('\n')
      }`,
    ),
    {
      type: 'context',
      elements: [{ type: 'mrkdwn', text: `Envelope sha256 \`${hash}\` · approval \`${approvalId}\`` }],
    },
  ];
  const value = JSON.stringify({ approval_id: approvalId, envelope_sha256: hash });
  const buttons: Block[] = [];
  if (code.length <= MAX_CODE && hidden.length === 0)
    buttons.push({
      type: 'button',
      action_id: APPROVE_ACTION,
      style: 'primary',
      text: { type: 'plain_text', text: 'Approve' },
      value,
    });
  buttons.push({
    type: 'button',
    action_id: REJECT_ACTION,
    style: 'danger',
    text: { type: 'plain_text', text: 'Reject' },
    value,
  });
  blocks.push({ type: 'actions', block_id: `approval:${approvalId}`, elements: buttons });
  return { text, blocks };
}

const DECISION_WORDS: Record<string, string> = {
  approved: 'approved',
  executed: 'approved and reserved',
  rejected: 'rejected',
  expired: 'expired before anyone decided',
  invalidated: 'no longer valid: what it showed changed (reapproval required)',
};

/** The line that replaces an approval request's buttons once it is decided, expired or invalidated. */
export function slackDecision(e: ClaimedEvent): { text: string; blocks: Block[] } {
  const p = e.payload;
  const status = txt(p.status);
  const approvers = Array.isArray(p.approvers) ? p.approvers.map(String) : [];
  const lines = [
    `Approval \`${slackText(txt(p.approval_id))}\` for \`${slackText(txt(p.tool))}\`: *${DECISION_WORDS[status] ?? slackText(status)}*`,
    approvers.length > 0 ? `Approved by ${approvers.map((a) => `\`${slackText(a)}\``).join(', ')}` : null,
    typeof p.reason === 'string' ? `Reason: ${slackText(p.reason)}` : null,
    typeof p.operation_id === 'string' ? `Operation \`${p.operation_id}\`` : null,
  ].filter((l) => l !== null);
  return { text: lines[0] ?? status, blocks: [section(lines.join('\n'))] };
}

/** Any other event as one Slack message. */
export function slackNotice(e: ClaimedEvent): { text: string; blocks: Block[] } {
  const p = e.payload;
  const tool = p.tool === undefined || p.tool === null ? 'every tool' : `\`${slackText(txt(p.tool))}\``;
  const reason = typeof p.reason === 'string' ? `: ${slackText(p.reason)}` : '';
  const headline: Record<string, string> = {
    'operation.review': `Operation \`${txt(p.operation_id)}\` (${tool}) needs review${reason}`,
    'compensation.escalated': `Compensation of operation \`${txt(p.operation_id)}\` (${tool}) needs a person${reason}`,
    'kill_switch.engaged': `Kill switch engaged for ${tool} in tenant \`${slackText(txt(p.tenant_id))}\` by \`${slackText(txt(p.engaged_by))}\`${reason}`,
    'kill_switch.lifted': `Kill switch lifted for ${tool} in tenant \`${slackText(txt(p.tenant_id))}\``,
  };
  const text = headline[e.event_type] ?? `${e.event_type} ${slackText(e.subject_id)}`;
  return { text, blocks: [section(text)] };
}
