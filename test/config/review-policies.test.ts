/**
 * Review policies in the configuration (config/review-policies.ts): a policy compiles with its actor and
 * signature; one naming a reason whose outcome is not proven, or a decision, is refused at compile with why;
 * tools must be routed, names unique, one policy per tool and reason, and the date real.
 */
import t from 'tap';
import { compileConfig, loadConfig } from '../../config/index.js';
import { coveringPolicy } from '../../config/review-policies.js';

const tool = {
  provider_id: 'billing',
  endpoint: 'https://billing.example.org/v3/refunds',
  allowed_tenants: ['tenant-a'],
  idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
};

const policy = {
  name: 'retry-no-effect',
  tools: ['issue_refund'],
  reasons: ['no_effect_confirmed'],
  max_retries: 2,
  authorized_by: 'alice@example.com',
  authorized_at: '2026-12-01',
};

function problemsOf(review_policies: unknown[]): { path: string; message: string }[] {
  try {
    compileConfig({ tools: { issue_refund: tool, void_refund: tool }, review_policies }, {});
  } catch (err) {
    const e = err as { code: string; details: { issues: { path: string; message: string }[] } };
    if (e.code !== 'config_invalid') throw err;
    return e.details.issues;
  }
  return [];
}

t.test('a policy compiles: its reasons, actor, and a signature that changes with any field', (t) => {
  const cfg = compileConfig({ tools: { issue_refund: tool }, review_policies: [policy] }, {});
  const [p] = cfg.reviewPolicies;
  t.equal(p?.name, 'retry-no-effect');
  t.same(p?.reasons, ['no_effect_confirmed']);
  t.equal(p?.maxRetries, 2);
  t.equal(p?.actor, 'policy:retry-no-effect (authorized_by alice@example.com)');
  t.match(p?.sha256, /^[0-9a-f]{64}$/);
  const changed = compileConfig({ tools: { issue_refund: tool }, review_policies: [{ ...policy, max_retries: 3 }] }, {})
    .reviewPolicies[0];
  t.not(changed?.sha256, p?.sha256, 'a changed policy is a different policy');
  const again = compileConfig({ tools: { issue_refund: tool }, review_policies: [{ ...policy }] }, {})
    .reviewPolicies[0];
  t.equal(again?.sha256, p?.sha256, 'the same policy, the same signature');
  t.same(compileConfig({ tools: { issue_refund: tool } }, {}).reviewPolicies, [], 'none by default');
  t.end();
});

t.test('a reason whose outcome is not proven, or a decision, is refused at compile with why', (t) => {
  for (const reason of [
    'unknown',
    'reconcile_attempts_exhausted',
    'readback_mismatch',
    'no_readback_contract',
    'provider_no_receipt',
    'authorization_denied',
    'authorization:authorization_denied',
    'final_check:tool_disabled',
    'final_check:role_revoked',
    'route_changed',
    'worker:worker_lost',
  ]) {
    const issues = problemsOf([{ ...policy, reasons: [reason] }]);
    t.equal(issues.length, 1, reason);
    t.equal(issues[0]?.path, '/review_policies/0/reasons/0', reason);
    t.match(issues[0]?.message, /is never retried by a policy: .*only a person decides it/, reason);
  }
  const other = problemsOf([{ ...policy, reasons: ['no_effect_confirmd'] }]);
  t.match(other[0], { path: '/review_policies/0/reasons/0', message: /not a reason a policy may retry/ });
  t.end();
});

t.test('tools routed, names unique, one policy per tool and reason, a real date, a closed object', (t) => {
  t.match(problemsOf([{ ...policy, tools: ['issue_refnd'] }]), [
    { path: '/review_policies/0/tools/0', message: /no route in \/tools/ },
  ]);
  t.match(problemsOf([policy, { ...policy, tools: ['void_refund'] }]), [
    { path: '/review_policies/1/name', message: /another policy/ },
  ]);
  t.match(problemsOf([policy, { ...policy, name: 'second' }]), [
    { path: '/review_policies/1/reasons', message: /policy retry-no-effect covers already/ },
  ]);
  t.match(problemsOf([{ ...policy, authorized_at: '2026-02-30' }]), [
    { path: '/review_policies/0/authorized_at', message: /not a real date/ },
  ]);
  t.ok(problemsOf([{ ...policy, signed: 'x' }]).length > 0, 'an unknown field is refused');
  t.ok(problemsOf([{ ...policy, authorized_by: undefined }]).length > 0, 'who authorized it is required');
  t.ok(problemsOf([{ ...policy, max_retries: 0 }]).length > 0, 'at least one retry');
  t.ok(problemsOf([{ ...policy, authorized_by: 'a'.repeat(161) }]).length > 0, 'a name the actor can hold');
  const longest = compileConfig(
    {
      tools: { issue_refund: tool },
      review_policies: [{ ...policy, name: `p${'-'.repeat(63)}`, authorized_by: 'a'.repeat(160) }],
    },
    {},
  ).reviewPolicies[0];
  t.ok((longest?.actor.length ?? 999) <= 256, 'the longest actor fits what a review action records');
  t.ok(problemsOf([{ ...policy, authorized_by: 'alice\nmallory' }]).length > 0, 'no control characters');
  t.end();
});

t.test('which policy covers a review reason: exact reasons and prefixes', (t) => {
  const cfg = compileConfig(
    {
      tools: { issue_refund: tool, void_refund: tool },
      review_policies: [{ ...policy, reasons: ['no_effect_confirmed', 'provider_unreachable', 'internal'] }],
    },
    {},
  );
  const covers = (toolName: string, reason: string): string | undefined =>
    coveringPolicy(cfg.reviewPolicies, toolName, reason)?.reason;
  t.equal(covers('issue_refund', 'no_effect_confirmed'), 'no_effect_confirmed');
  t.equal(covers('issue_refund', 'provider:provider_unreachable:econnrefused'), 'provider_unreachable');
  t.equal(covers('issue_refund', 'internal:42P01'), 'internal');
  t.equal(covers('issue_refund', 'readback_mismatch'), undefined);
  t.equal(covers('issue_refund', 'authorization:authorization_denied'), undefined);
  t.equal(covers('void_refund', 'no_effect_confirmed'), undefined, 'another tool');
  t.end();
});

t.test('the shipped example configuration has a review policy', (t) => {
  const cfg = loadConfig({ ACTIONLEDGER_CONFIG: 'actionledger.config.json' });
  t.ok(cfg.reviewPolicies.length > 0);
  t.end();
});
