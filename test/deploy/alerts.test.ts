import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Metrics } from '../../core/metrics.js';
import { DispatchMetrics } from '../../dispatcher/metrics.js';
import { ReconcileMetrics } from '../../reconciler/metrics.js';
import type { Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { WriteProbe } from '../../server/write-probe.js';

const root = join(import.meta.dirname, '..', '..', '..');

t.test('every metric the alert rules use is one the service exposes', async (t) => {
  const rules = ['alerts.yml', 'rules.yml']
    .map((f) => readFileSync(join(root, 'deploy', 'prometheus', f), 'utf8'))
    .join('\n');
  const exprs = [...rules.matchAll(/expr: (\|\n((?: {10}.*\n)+)|.*)/g)].map((m) => m[2] ?? m[1] ?? '');
  t.ok(exprs.length >= 8, 'rules found');
  // A name after a colon is a recording rule's (provider:actionledger_...:ratio_rate5m), checked by promtool.
  const used = new Set(
    exprs.flatMap((e) =>
      [...e.matchAll(/(?<![:\w])actionledger_[a-z_]+(?![:\w])/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')),
    ),
  );
  const m = new Metrics({ defaultMetrics: false });
  new DispatchMetrics(m.registry);
  new ReconcileMetrics(m.registry);
  // The serving process's write probe registers its gauge on the process registry (not probing here).
  new WriteProbe({
    pool: {} as Pool,
    schemaQuoted: 'actionledger',
    intervalMs: 1000,
    log: createLogger({ level: 'silent', name: 'test' }),
    registry: m.registry,
  });
  const exposed = new Set(
    [...(await m.registry.getMetricsAsJSON()), ...(await m.ledgerGauges.getMetricsAsJSON())].map((x) => x.name),
  );
  for (const name of used) t.ok(exposed.has(name), `${name} is exposed`);
  const alerts = [...rules.matchAll(/- alert: (\w+)/g)].map((x) => x[1]);
  t.equal(new Set(alerts).size, alerts.length, 'alert names are unique');
});

t.test('the runbook has one section for every alert, and none for an alert that does not exist', (t) => {
  const rules = readFileSync(join(root, 'deploy', 'prometheus', 'alerts.yml'), 'utf8');
  const alerts = [...rules.matchAll(/- alert: (\w+)/g)].map((x) => x[1]).sort();
  const runbook = readFileSync(join(root, 'docs', 'runbook.md'), 'utf8');
  const sections = [...runbook.matchAll(/^## (\w+) \((page|ticket)\)$/gm)].map((x) => x[1]).sort();
  t.same(sections, alerts);
  for (const m of rules.matchAll(/- alert: (\w+)[\s\S]*?severity: (\w+)/g))
    t.match(runbook, new RegExp(`^## ${m[1]} \\(${m[2]}\\)$`, 'm'), `${m[1]}: its severity in the heading`);
  t.end();
});
