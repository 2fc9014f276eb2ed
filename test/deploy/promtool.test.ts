import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const dir = join(import.meta.dirname, '..', '..', '..', 'deploy', 'prometheus');

/** Prometheus's own rule checker; `.ci/run` installs Debian's `prometheus` package for it. */
function promtool(...args: string[]): { code: number | null; out: string } {
  const r = spawnSync('promtool', args, { cwd: dir, encoding: 'utf8' });
  if (r.error !== undefined) throw new Error(`promtool not found (apt-get install prometheus): ${r.error.message}`);
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

t.test('promtool accepts the alert rules', (t) => {
  const r = promtool('check', 'rules', 'alerts.yml');
  t.equal(r.code, 0, r.out);
  t.match(r.out, /SUCCESS: \d+ rules found/);
  t.end();
});

t.test("promtool's unit tests pass, and every alert is tested firing and not firing", (t) => {
  const r = promtool('test', 'rules', 'alerts.test.yml');
  t.equal(r.code, 0, r.out);
  t.match(r.out, /SUCCESS/);
  const alerts = [...readFileSync(join(dir, 'alerts.yml'), 'utf8').matchAll(/- alert: (\w+)/g)].map((m) => m[1]);
  const cases = [
    ...readFileSync(join(dir, 'alerts.test.yml'), 'utf8').matchAll(/alertname: (\w+)\n\s+exp_alerts:( \[\])?/g),
  ].map((m) => ({ alert: m[1], fires: m[2] === undefined }));
  t.ok(alerts.length >= 9, `${alerts.length} alerts`);
  for (const alert of alerts) {
    t.ok(
      cases.some((c) => c.alert === alert && c.fires),
      `${alert}: a case where it fires`,
    );
    t.ok(
      cases.some((c) => c.alert === alert && !c.fires),
      `${alert}: a case where it does not`,
    );
  }
  t.same(
    cases.filter((c) => !alerts.includes(c.alert)),
    [],
    'no case names an alert that does not exist',
  );
  t.end();
});

t.test("promtool accepts the recording rules, and its unit tests check every one's value", (t) => {
  const check = promtool('check', 'rules', 'rules.yml');
  t.equal(check.code, 0, check.out);
  const r = promtool('test', 'rules', 'rules.test.yml');
  t.equal(r.code, 0, r.out);
  t.match(r.out, /SUCCESS/);
  const records = [...readFileSync(join(dir, 'rules.yml'), 'utf8').matchAll(/- record: (\S+)/g)].map((m) => m[1] ?? '');
  t.ok(records.length >= 4, `${records.length} recording rules`);
  const tested = [
    ...readFileSync(join(dir, 'rules.test.yml'), 'utf8').matchAll(
      /- expr: (.+)\n\s+eval_time: \S+\n\s+exp_samples:\n\s+- labels/g,
    ),
  ].map((m) => m[1] ?? '');
  for (const record of records)
    if (!record.endsWith('_bucket:rate5m'))
      t.ok(
        tested.some((e) => new RegExp(`(^|[^:\\w])${record.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\b`).test(e)),
        `${record}: a test with the value it records`,
      );
  t.end();
});
