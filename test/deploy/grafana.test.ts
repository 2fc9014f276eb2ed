/**
 * The Grafana dashboard (deploy/grafana/actionledger.json): every panel parsed, every PromQL expression checked
 * by Prometheus's own parser (promtool, each wrapped in a recording rule), and every metric it names one the
 * service exposes or a recording rule of deploy/prometheus/rules.yml.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Metrics } from '../../core/metrics.js';
import { DispatchMetrics } from '../../dispatcher/metrics.js';
import { ReconcileMetrics } from '../../reconciler/metrics.js';
import type { Pool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { WriteProbe } from '../../server/write-probe.js';
import { parse } from 'yaml';

const root = join(import.meta.dirname, '..', '..', '..');

interface Target {
  refId: string;
  expr?: string;
  datasource?: { type: string; uid: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { type: string; uid: string };
  targets?: Target[];
  panels?: Panel[];
}
interface Dashboard {
  uid: string;
  title: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: string }[] };
}

const dashboard = JSON.parse(readFileSync(join(root, 'deploy', 'grafana', 'actionledger.json'), 'utf8')) as Dashboard;
/** Every panel, those inside collapsed rows too. */
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const queries = panels.filter((p) => p.type !== 'row');

const KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'bool',
  'offset',
  'by',
  'without',
  'on',
  'ignoring',
  'group_left',
  'group_right',
  'inf',
  'nan',
]);

/**
 * The metric names a PromQL expression selects: what is left of it once strings, label matchers, ranges,
 * grouping clauses, numbers, keywords and function names are taken out.
 */
export function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/g, ' ')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\boffset\s+-?(\d+(ms|[smhdwy]))+/gi, ' ')
    .replace(/(?<![\w:])\d+(\.\d+)?(e[+-]?\d+)?(?![\w:])/gi, ' ');
  const names: string[] = [];
  for (const m of bare.matchAll(/[a-zA-Z_:][\w:]*/g)) {
    const after = bare.slice((m.index ?? 0) + m[0].length);
    if (/^\s*\(/.test(after) || KEYWORDS.has(m[0].toLowerCase())) continue;
    names.push(m[0]);
  }
  return names;
}

async function exposed(): Promise<Set<string>> {
  const m = new Metrics();
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
  const names = new Set<string>();
  for (const x of [...(await m.registry.getMetricsAsJSON()), ...(await m.ledgerGauges.getMetricsAsJSON())]) {
    names.add(x.name);
    // A histogram is selected through its series.
    if (String(x.type) === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(`${x.name}${s}`);
  }
  return names;
}

t.test('the extractor finds metric names and nothing else', (t) => {
  t.same(
    metricNames(
      'histogram_quantile(0.99, sum by (provider, le) (rate(a_seconds_bucket{outcome=~"x|y", le!="1"}[5m]))) / on (provider) group_left b:c:ratio > 1e-9 and time() - max(d_total offset 5m) > 4 * 3600',
    ),
    ['a_seconds_bucket', 'b:c:ratio', 'd_total'],
  );
  t.end();
});

t.test('panels: unique ids, laid out without overlap, each querying the chosen Prometheus', (t) => {
  t.equal(dashboard.uid, 'actionledger');
  const ids = panels.map((p) => p.id);
  t.equal(new Set(ids).size, ids.length, 'panel ids are unique');
  const ds = dashboard.templating.list.find((v) => v.type === 'datasource');
  t.same([ds?.name, ds?.query], ['datasource', 'prometheus'], 'a Prometheus data source variable');
  t.ok(queries.length >= 20, `${queries.length} panels`);
  for (const p of queries) {
    t.equal(p.datasource?.uid, '${datasource}', `${p.title}: the chosen data source`);
    t.ok((p.targets ?? []).length > 0 && p.targets?.every((x) => (x.expr ?? '').trim() !== ''), `${p.title}: queries`);
  }
  const cells = new Map<string, string>();
  for (const p of panels) {
    const { h, w, x, y } = p.gridPos;
    t.ok(x >= 0 && w > 0 && x + w <= 24, `${p.title}: within the 24 columns`);
    for (let i = x; i < x + w; i++)
      for (let j = y; j < y + h; j++) {
        const key = `${i},${j}`;
        const other = cells.get(key);
        cells.set(key, p.title);
        if (other !== undefined) {
          t.fail(`${p.title} overlaps ${other}`);
          i = x + w; // one failure per panel
          break;
        }
      }
  }
  for (const title of ['Fleet', 'API and gate', 'Reconciliation'])
    t.ok(
      panels.some((p) => p.type === 'row' && p.title === title),
      `a ${title} row`,
    );
  t.end();
});

t.test('every expression parses with Prometheus’s own parser', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-grafana-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const rules = queries.flatMap((p) =>
    (p.targets ?? []).map((x) => ({ record: `dashboard:panel_${p.id}_${x.refId}`, expr: x.expr ?? '' })),
  );
  // JSON is YAML: the rule file is written as JSON.
  writeFileSync(join(dir, 'dashboard.rules.yml'), JSON.stringify({ groups: [{ name: 'dashboard', rules }] }));
  const r = spawnSync('promtool', ['check', 'rules', 'dashboard.rules.yml'], { cwd: dir, encoding: 'utf8' });
  if (r.error !== undefined) throw new Error(`promtool not found (apt-get install prometheus): ${r.error.message}`);
  t.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  t.match(r.stdout, new RegExp(`SUCCESS: ${rules.length} rules found`));
  t.end();
});

t.test('every metric a panel names is exposed by the service or recorded by a rule', async (t) => {
  const names = await exposed();
  const recorded = new Set(
    [...readFileSync(join(root, 'deploy', 'prometheus', 'rules.yml'), 'utf8').matchAll(/- record: (\S+)/g)].map(
      (m) => m[1] ?? '',
    ),
  );
  const used = new Set(queries.flatMap((p) => (p.targets ?? []).flatMap((x) => metricNames(x.expr ?? ''))));
  t.ok(used.size >= 20, `${used.size} metrics`);
  for (const name of used) t.ok(names.has(name) || recorded.has(name), `${name} is exposed or recorded`);
  t.notOk(names.has('actionledger_outbox_depht'), 'a misspelt name is not');
  for (const name of recorded) t.ok(used.has(name) || name.endsWith('_bucket:rate5m'), `${name} has a panel`);

  // What pages the on-call is on the dashboard: every metric an alert names.
  const alerts = readFileSync(join(root, 'deploy', 'prometheus', 'alerts.yml'), 'utf8');
  for (const m of new Set([...alerts.matchAll(/\bactionledger_[a-z_]+/g)].map((x) => x[0])))
    t.ok(used.has(m), `${m} (alerted on) has a panel`);
});

t.test('a latency panel shows exemplars, and the provisioned Prometheus links their trace_id to the traces', (t) => {
  const exemplarPanels = queries.filter((p) => (p.targets ?? []).some((q) => (q as { exemplar?: boolean }).exemplar));
  t.ok(exemplarPanels.length >= 1, 'a panel asks for exemplars');
  for (const p of exemplarPanels)
    for (const q of p.targets ?? [])
      t.match(q.expr, /actionledger_(provider_request_duration|dispatch_enqueue_to_outcome)_seconds_bucket/, p.title);
  const sources = parse(readFileSync(join(root, 'deploy', 'grafana', 'datasources.yaml'), 'utf8')) as {
    datasources: { uid: string; type: string; jsonData?: { exemplarTraceIdDestinations?: unknown[] } }[];
  };
  const prometheus = sources.datasources.find((d) => d.type === 'prometheus');
  const destinations = (prometheus?.jsonData?.exemplarTraceIdDestinations ?? []) as {
    name: string;
    datasourceUid: string;
  }[];
  t.same(
    destinations.map((d) => d.name),
    ['trace_id'],
    'the exemplar label the service writes (core/metrics.ts recordExemplar)',
  );
  t.ok(
    sources.datasources.some((d) => d.uid === destinations[0]?.datasourceUid && d.type === 'tempo'),
    'it opens in the provisioned Tempo',
  );
  t.end();
});
