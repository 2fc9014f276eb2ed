/**
 * What a Slack approval message shows when the arguments are hostile: text that tries to close the code block,
 * mention a channel or plant a link is shown inert and exact; arguments too long to show offer no Approve.
 */
import t from 'tap';
import { compileConfig } from '../../core/config.js';
import type { JsonObject } from '../../core/json.js';
import { slackApprovalRequest, type ClaimedEvent } from '../../notifier/render.js';
import { gateRoutes, gateSection } from '../helpers/gate.js';

const config = compileConfig({ tools: gateRoutes(), gate: gateSection() }, {});

function event(args: JsonObject): ClaimedEvent {
  return {
    event_id: '00000000-0000-4000-8000-000000000001',
    destination: 'chat',
    attempts: 1,
    event_type: 'approval.requested',
    tenant_id: 'tenant-a',
    tool_name: 'transfer_funds',
    subject_id: 'a-1',
    created_at: new Date(),
    now_s: Date.parse('2026-01-01T00:00:00Z') / 1000,
    payload: {
      approval_id: 'a-1',
      tool: 'transfer_funds',
      requester_id: 'agent-1',
      requester_role: 'agent',
      required_approvals: 1,
      envelope_sha256: 'f'.repeat(64),
      expires_at: '2026-01-01T00:10:00Z',
      envelope: { tool: 'transfer_funds', arguments: args, resources: [] },
    },
  };
}

const texts = (blocks: Record<string, unknown>[]): string[] =>
  blocks.map((b) => (b.text as { text?: string } | undefined)?.text ?? '');
const buttons = (blocks: Record<string, unknown>[]): string[] =>
  ((blocks.at(-1)?.elements ?? []) as { action_id: string }[]).map((e) => e.action_id);

t.test('hostile arguments are shown exactly and inert', (t) => {
  const hostile = '```\n*APPROVED BY SECURITY* <!channel> <https://evil.example|safe link> & more';
  const msg = slackApprovalRequest(config, event({ to_account: hostile, amount: 5, memo: 'secret note' }));
  const code = texts(msg.blocks).find((x) => x.startsWith('*Arguments*')) ?? '';
  t.equal(code.match(/```/g)?.length, 2, 'one code block: the arguments cannot close it early');
  t.notMatch(code, /<!channel>|<https:/, 'no mention or link survives');
  t.match(code, /&lt;!channel&gt; &lt;https:\/\/evil.example\|safe link&gt; &amp; more/, 'shown as text');
  t.match(code, /\\u0060\\u0060\\u0060/, 'the backticks written as their JSON escapes');
  t.notMatch(JSON.stringify(msg), /secret note/);
  t.match(texts(msg.blocks).join('\n'), /Time left: \*10 min\*/);
  const memoShown = /"memo": "([^"]*)"/.exec(code)?.[1];
  t.equal(memoShown, '[redacted]', "the tool's redaction applies (transfer_funds redacts memo)");
  t.same(buttons(msg.blocks), ['actionledger_approve', 'actionledger_reject']);
  t.end();
});

t.test('arguments too long to show: Reject only', (t) => {
  const msg = slackApprovalRequest(config, event({ to_account: 'ACC0000000001', amount: 5, to: 'x'.repeat(4000) }));
  t.match(texts(msg.blocks).join('\n'), /too long to show here/);
  t.same(buttons(msg.blocks), ['actionledger_reject'], 'nobody approves what the message did not show');
  t.end();
});
