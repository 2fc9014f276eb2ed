/**
 * What a person reads is what they approve: an approval whose envelope holds characters a reader would not see
 * as written (a right-to-left override that turns "0057" into "7500" on screen, a Hangul filler, a digit struck
 * through by U+0336, a private-use or null-notehead character drawn as nothing) is shown with each as its code,
 * text written right to left (a Hebrew letter turns "1234 5678" into "5678 1234" on screen) is shown in stored
 * order, and approving either takes an explicit second yes, over the gate, the HTTP API and the console alike.
 * Without it nothing is recorded; with it the operation is reserved.
 * Real HTTP, a real PostgreSQL, the console's real forms.
 */
import t, { type Test } from 'tap';
import type { GateResult } from '../../gate/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { get, person, post, signIn } from '../helpers/console-http.js';
import { gctx } from '../helpers/gate.js';

/** issue_refund with a free-text note (what an agent fills from text it read), its cap raised to reach approval. */
const refundWithNote = {
  tools: {
    issue_refund: {
      schema: {
        type: 'object',
        additionalProperties: false,
        required: ['order_id', 'amount', 'currency'],
        properties: {
          order_id: { type: 'string', pattern: '^O-[0-9]{1,10}$' },
          amount: { type: 'number', exclusiveMinimum: 0, maximum: 10000 },
          currency: { type: 'string', enum: ['GBP'] },
          note: { type: 'string', maxLength: 200 },
        },
      },
      limits: { per_conversation: { max_count: 10, max_value: 5000 } },
    },
  },
};

/** A refund of 900 (over the threshold: it waits for a supervisor) whose note hides what it says. */
async function held(f: ApiFixture, step: string, note: string, conversation = 'conv-1'): Promise<string> {
  const context = gctx({ workflow_step_id: step, conversation_id: conversation });
  const r: GateResult = await f.gate.call(context, 'issue_refund', {
    order_id: 'O-1',
    note,
    amount: 900,
    currency: 'GBP',
  });
  if (r.ok || r.error !== 'approval_required' || r.request_id === undefined) throw new Error(JSON.stringify(r));
  return r.request_id;
}

async function state(f: ApiFixture, id: string): Promise<{ status: string; approvers: string[] }> {
  const { rows } = await f.pool.query<{ status: string; approvers: string[] }>(
    'SELECT status, approvers FROM actionledger.gate_approvals WHERE approval_id = $1',
    [id],
  );
  if (rows[0] === undefined) throw new Error(`no approval ${id}`);
  return rows[0];
}

async function setup(t: Test) {
  const f = await apiFixture(t, { gate: refundWithNote });
  const sup = await f.token('sup-1', ['supervisor'], { kind: 'person' });
  return { f, sup };
}

t.test('the gate refuses an approval with hidden characters unless acknowledged', async (t) => {
  const { f } = await setup(t);
  const id = await held(f, 'g-1', 'refund of \u202e0057\u202c GBP');
  const view = await f.gate.approvals.show(id, { tenant_id: 'tenant-a' });
  const reviewer = { tenant_id: 'tenant-a', principal_id: 'sup-1', role: 'supervisor' };
  const refused = await f.gate.approve(id, view.envelope_sha256, reviewer);
  t.match(refused, { ok: false, error: 'hidden_characters', message: /\\u202E at \/effect/, request_id: id });
  const hidden = (refused.ok ? [] : ((refused.details?.hidden ?? []) as { path: string }[])).filter(
    (h) => h.path === '/arguments/note',
  );
  t.same(
    hidden,
    [
      { path: '/arguments/note', code: '\\u202E', in: 'value', class: 'hidden' },
      { path: '/arguments/note', code: '\\u202C', in: 'value', class: 'hidden' },
    ],
    'each one, where it is in the envelope (the effect in words quotes the note too)',
  );
  t.same(await state(f, id), { status: 'pending', approvers: [] }, 'no vote recorded');
  const audit = await f.pool.query<{ outcome: string }>(
    "SELECT outcome FROM actionledger.gate_audit WHERE action = 'approve' AND subject_id = $1",
    [id],
  );
  t.same(
    audit.rows.map((r) => r.outcome),
    ['hidden_characters'],
    'the refusal is audited',
  );
  const approved = await f.gate.approve(id, view.envelope_sha256, reviewer, { acknowledgeHiddenCharacters: true });
  t.match(approved, { ok: true, status: 'reserved', operation_id: /^[0-9a-f-]{36}$/ });
  // An envelope without hidden characters needs no acknowledgement.
  const plain = await held(f, 'g-2', 'refund of 0057 GBP');
  const plainView = await f.gate.approvals.show(plain, { tenant_id: 'tenant-a' });
  t.match(await f.gate.approve(plain, plainView.envelope_sha256, reviewer), { ok: true, status: 'reserved' });
});

t.test('over HTTP: 422 hidden_characters, then approved with acknowledge_hidden_characters', async (t) => {
  const { f, sup } = await setup(t);
  const id = await held(f, 'h-1', 'ref \u3164 9\u0336');
  const shown = await f.call('GET', `/v1/approvals/${id}`, { token: sup });
  const hash = String((shown.body as { envelope_sha256: string }).envelope_sha256);
  t.same(shown.body.blockers, [], 'hidden characters are no blocker: a requirement, asked for below');
  const refused = await f.call('POST', `/v1/approvals/${id}/approve`, { token: sup, body: { envelope_sha256: hash } });
  t.equal(refused.status, 422);
  t.match(refused.body, { ok: false, error: 'hidden_characters', details: { request_id: id } });
  const listed = (refused.body as { details: { hidden: { path: string; code: string }[] } }).details.hidden;
  t.same(
    listed.filter((h) => h.path === '/arguments/note').map((h) => h.code),
    ['\\u3164', '\\u0336'],
  );
  t.same(await state(f, id), { status: 'pending', approvers: [] });
  const no = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: sup,
    body: { envelope_sha256: hash, acknowledge_hidden_characters: false },
  });
  t.equal(no.status, 422, 'false is no acknowledgement');
  const yes = await f.call('POST', `/v1/approvals/${id}/approve`, {
    token: sup,
    body: { envelope_sha256: hash, acknowledge_hidden_characters: true },
  });
  t.equal(yes.status, 200);
  t.match(yes.body, { ok: true, status: 'reserved' });
});

t.test('the console shows each code, requires the box, and approves once it is ticked', async (t) => {
  const { f } = await setup(t);
  await person(f, 'sup-2', ['supervisor']);
  const id = await held(f, 'c-1', 'refund of \u202e0057\u202c GBP');
  const s = await signIn(f, 'sup-2');
  const page = await (await get(f, `/console/approvals/tenant-a/${id}`, s.cookie)).text();
  t.notOk(/[\u202e\u202c]/u.test(page), 'no hidden character is drawn raw anywhere on the page');
  t.match(page, /<span class="hidden-char"[^>]*>\\u202E<\/span>0057<span class="hidden-char"[^>]*>\\u202C<\/span>/);
  t.match(page, /id="hidden-chars"/, 'the warning');
  t.match(
    page,
    /<input\s+type="checkbox"\s+id="acknowledge-hidden"\s+name="acknowledge_hidden_characters"\s+value="yes"\s+required/,
  );
  const hash = /name="envelope_sha256" value="([0-9a-f]{64})"/.exec(page)?.[1] ?? '';
  const path = `/console/approvals/tenant-a/${id}/approve`;
  const unticked = await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash });
  t.equal(unticked.status, 422, 'the server requires it too, not only the browser');
  t.match((await unticked.text()).replace(/\s+/g, ' '), /hidden_characters/);
  t.same(await state(f, id), { status: 'pending', approvers: [] });
  const ticked = await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash, acknowledge_hidden_characters: 'yes' });
  t.equal(ticked.status, 303);
  t.same((await state(f, id)).status, 'executed');
});

t.test('the rejection reason and the requester are shown by their codes', async (t) => {
  const { f } = await setup(t);
  await person(f, 'sup-3', ['supervisor']);
  const id = await held(f, 'r-1', 'plain');
  const s = await signIn(f, 'sup-3');
  const rejected = await post(f, `/console/approvals/tenant-a/${id}/reject`, s, {
    csrf: s.csrf,
    reason: 'refund \u202eyaw on\u202c',
  });
  t.equal(rejected.status, 303);
  const page = await (await get(f, `/console/approvals/tenant-a/${id}`, s.cookie)).text();
  t.notOk(/[\u202e\u202c]/u.test(page));
  t.match(page, /refund <span class="hidden-char"[^>]*>\\u202E<\/span>yaw on/);
});

t.test(
  'drawn as nothing though no property says so, and text written right to left: refused unless acknowledged',
  async (t) => {
    const { f } = await setup(t);
    const reviewer = { tenant_id: 'tenant-a', principal_id: 'sup-1', role: 'supervisor' };
    const cases: [string, string, RegExp][] = [
      ['n-1', 'pay invoice 1\u{1D159}000', /\\u\{1D159\} at \/effect/],
      ['n-2', 'pay invoice 10\ue000\ue00100', /\\uE000 at \/effect/],
      ['n-3', 'from \u{F0000}plane 15', /\\u\{F0000\} at \/effect/],
      ['n-4', 'x\u{16FE4}y', /\\u\{16FE4\} at \/effect/],
      ['n-5', 'IBAN \u05d0 1234 5678', /right-to-left text at \/effect \(\\u05D0 first\)/],
    ];
    for (const [step, note, message] of cases) {
      const id = await held(f, step, note, `conv-${step}`);
      const view = await f.gate.approvals.show(id, { tenant_id: 'tenant-a' });
      const refused = await f.gate.approve(id, view.envelope_sha256, reviewer);
      t.match(refused, { ok: false, error: 'hidden_characters', message }, JSON.stringify(note));
      t.same(await state(f, id), { status: 'pending', approvers: [] }, 'no vote recorded');
      const approved = await f.gate.approve(id, view.envelope_sha256, reviewer, { acknowledgeHiddenCharacters: true });
      t.match(approved, { ok: true, status: 'reserved' }, 'approved once acknowledged');
    }
    const rtl = await held(f, 'n-6', 'IBAN \u05d0 1234 5678', 'conv-n-6');
    const view = await f.gate.approvals.show(rtl, { tenant_id: 'tenant-a' });
    const refused = await f.gate.approve(rtl, view.envelope_sha256, reviewer);
    const listed = refused.ok ? [] : (refused.details?.hidden as { path: string }[]);
    t.same(
      listed.filter((h) => h.path === '/arguments/note'),
      [{ path: '/arguments/note', code: '\\u05D0', in: 'value', class: 'right_to_left' }],
      'the string is named, with its first right-to-left letter',
    );
  },
);

t.test('a principal id written right to left or drawn as nothing is refused before anything is held', async (t) => {
  const { f } = await setup(t);
  const runtime = await f.token('runtime-1', ['agent-runtime']);
  for (const who of ['supervisor-1\u{1D159}', 'sup\u05d0-1', 'user\ue000']) {
    const r = await f.call('POST', '/v1/calls', {
      token: runtime,
      body: {
        tool: 'issue_refund',
        arguments: { order_id: 'O-1', amount: 900, currency: 'GBP' },
        task_id: 'task-p',
        workflow_step_id: 'p-1',
        user: { principal_id: who, role: 'agent', account_id: 'acct-1', conversation_id: 'c-1', turn_id: '1' },
      },
    });
    t.equal(r.status, 422, JSON.stringify(who));
    t.match(r.body, { ok: false, error: 'invalid_context', details: { field: 'user.principal_id' } });
  }
  const { rows } = await f.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM actionledger.gate_approvals');
  t.equal(rows[0]?.n, 0, 'nothing held');
});

t.test('the console draws right-to-left text in stored order and asks for the box', async (t) => {
  const { f } = await setup(t);
  await person(f, 'sup-4', ['supervisor']);
  const id = await held(f, 'rtl-1', 'IBAN \u05d0 1234 5678');
  const s = await signIn(f, 'sup-4');
  const page = await (await get(f, `/console/approvals/tenant-a/${id}`, s.cookie)).text();
  t.match(page, /<bdo dir="ltr" class="logical-order"[^>]*>[^<]*IBAN \u05d0 1234 5678/, 'in the order it is stored');
  t.match(page, /id="hidden-chars"[^]*right to left/, 'the warning says why');
  t.match(page, /name="acknowledge_hidden_characters"[^>]*required/, 'the box');
  const hash = /name="envelope_sha256" value="([0-9a-f]{64})"/.exec(page)?.[1] ?? '';
  const path = `/console/approvals/tenant-a/${id}/approve`;
  t.equal((await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash })).status, 422, 'refused without it');
  const ticked = await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash, acknowledge_hidden_characters: 'yes' });
  t.equal(ticked.status, 303);
  t.same((await state(f, id)).status, 'executed');
});

t.test('a control character: the console asks for the box exactly when the gate would refuse', async (t) => {
  // JSON text writes ESC and backspace as escapes, so a check on it saw nothing; the console asks the gate's own.
  const { f } = await setup(t);
  await person(f, 'sup-5', ['supervisor']);
  const id = await held(f, 'ctl-1', 'pay\u001b[8m 9999\u0008');
  const s = await signIn(f, 'sup-5');
  const page = await (await get(f, `/console/approvals/tenant-a/${id}`, s.cookie)).text();
  t.match(page, /id="hidden-chars"/, 'the warning');
  t.match(page, /name="acknowledge_hidden_characters"[^>]*required/, 'the box');
  const hash = /name="envelope_sha256" value="([0-9a-f]{64})"/.exec(page)?.[1] ?? '';
  const path = `/console/approvals/tenant-a/${id}/approve`;
  const unticked = await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash });
  t.equal(unticked.status, 422, 'the gate refuses without it');
  t.match(await unticked.text(), /\\u001B at \/arguments\/note/);
  const ticked = await post(f, path, s, { csrf: s.csrf, envelope_sha256: hash, acknowledge_hidden_characters: 'yes' });
  t.equal(ticked.status, 303);
  t.same((await state(f, id)).status, 'executed');
});
