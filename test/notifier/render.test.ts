/**
 * What a Slack approval message shows when the arguments are hostile: text that tries to close the code block,
 * mention a channel or plant a link is shown inert and exact; arguments too long to show offer no Approve.
 */
import t from 'tap';
import { compileConfig } from '../../config/index.js';
import type { JsonObject } from '../../core/json.js';
import { slackApprovalRequest, webhookBody, type ClaimedEvent } from '../../notifier/render.js';
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

t.test('hidden characters are shown as codes everywhere in the message, and Approve is not offered', (t) => {
  // Reads "7500" where the stored bytes say 0057; a digit struck through by U+0336; a Hangul filler; a requester
  // name with a zero-width space (from before identifiers refused it).
  const e = event({ to_account: 'ACC\u3164001', amount: 5, to: 'refund of \u202e0057\u202c EUR, 9\u0336' });
  e.payload.requester_id = 'agent\u200b-1';
  const msg = slackApprovalRequest(config, e);
  const all = JSON.stringify(msg);
  const drawn = [msg.text, ...texts(msg.blocks), (msg.blocks[0]?.text as { text: string }).text].join('\n');
  t.notOk(/[\u202e\u202c\u3164\u200b]|\d\u0336/u.test(drawn), 'no hidden character reaches Slack raw');
  const code = texts(msg.blocks).find((x) => x.startsWith('*Arguments*')) ?? '';
  t.match(code, /refund of \\u202e0057\\u202c EUR, 9\\u0336/, 'the arguments with each one as its JSON escape');
  t.match(drawn, /agent\\u200B-1/, 'the requester as its code');
  t.match(texts(msg.blocks).join('\n'), /:warning: \*Hidden characters\*.*decide in the console/);
  t.same(buttons(msg.blocks), ['actionledger_reject'], 'Reject only');
  t.ok(all.length > 0);
  t.end();
});

t.test('a webhook body shows no hidden character raw, lists each, and parses to the same value', (t) => {
  const e = event({ to_account: 'ACC0000000001', amount: 5, to: 'refund of \u202e0057\u202c EUR' });
  const body = webhookBody(config, e);
  t.notOk(/[\u202e\u202c]/u.test(body), 'escaped in the JSON text');
  const parsed = JSON.parse(body) as { data: { envelope: { arguments: JsonObject }; hidden_characters: unknown } };
  t.equal(parsed.data.envelope.arguments.to, 'refund of \u202e0057\u202c EUR', 'the same value to a parser');
  const listed = parsed.data.hidden_characters as { path: string; code: string }[];
  t.same(
    listed.filter((h) => h.path === '/envelope/arguments/to'),
    [
      { path: '/envelope/arguments/to', code: '\\u202E', in: 'value', class: 'hidden' },
      { path: '/envelope/arguments/to', code: '\\u202C', in: 'value', class: 'hidden' },
    ],
  );
  t.ok(
    listed.some((h) => h.path === '/envelope/effect'),
    'and in the effect in words, which quotes the argument',
  );
  const plain = JSON.parse(webhookBody(config, event({ to_account: 'ACC0000000001', amount: 5, to: 'x' }))) as {
    data: JsonObject;
  };
  t.notOk('hidden_characters' in plain.data, 'absent when there are none');
  t.end();
});

t.test('text written right to left: Slack warns and offers no Approve, the webhook lists it', (t) => {
  // No control character: a visible Hebrew letter alone draws "IBAN 5678 1234 \u05d0" on screen.
  const e = event({ to_account: 'ACC0000000001', amount: 5, to: 'IBAN \u05d0 1234 5678' });
  const msg = slackApprovalRequest(config, e);
  const warning = texts(msg.blocks).find((x) => x.startsWith(':warning:')) ?? '';
  t.match(warning, /right-to-left text at \/envelope\/arguments\/to \(\\u05D0 first\)/, 'where, in words');
  t.match(warning, /decide in the console/);
  t.same(buttons(msg.blocks), ['actionledger_reject'], 'Reject only');
  const body = JSON.parse(webhookBody(config, e)) as { data: { hidden_characters: { path: string }[] } };
  t.same(
    body.data.hidden_characters.filter((h) => h.path === '/envelope/arguments/to'),
    [{ path: '/envelope/arguments/to', code: '\\u05D0', in: 'value', class: 'right_to_left' }],
  );
  t.end();
});
