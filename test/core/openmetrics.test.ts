/**
 * The OpenMetrics exposition (core/metrics.ts) shows the same samples as the text one: every name, label and
 * value, counters keeping their single `_total`, for one process and for the fleet's merge; only the exemplars
 * and the `# EOF` line differ. And which Accept headers get it (server/api/routes/system.ts).
 */
import t from 'tap';
import { AggregatorRegistry, Counter } from 'prom-client';
import { Metrics, openMetricsText, recordExemplar } from '../../core/metrics.js';
import { acceptsOpenMetrics } from '../../server/api/routes/system.js';

/**
 * The samples of an exposition, as `name{sorted labels} value` lines: comments, exemplars and `# EOF` left out.
 * The runtime's readings (memory, CPU, event loop) change between two reads: only their names and labels count.
 */
function samples(exposition: string): string[] {
  const out: string[] = [];
  for (const line of exposition.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})? (\S+)/.exec(line);
    if (m === null) throw new Error(`not a sample line: ${line}`);
    const [, name, braces, value] = m as unknown as [string, string, string | undefined, string];
    if (name.endsWith('_created')) continue;
    const labels: string[] = [];
    if (braces !== undefined)
      for (const l of braces.slice(1, -1).matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
        labels.push(`${l[1]}="${l[2]}"`);
    const volatile = /^actionledger_(nodejs|process)_/.test(name) && name !== 'actionledger_process_start_time_seconds';
    out.push(`${name}{${labels.sort().join(',')}} ${volatile ? '(reading)' : value}`);
  }
  return out.sort();
}

function processMetrics(worker: string | null): Metrics {
  const m = new Metrics({ cluster: 'eu-1', ledger: worker === null });
  if (worker !== null) m.registry.setDefaultLabels({ cluster: 'eu-1', worker });
  m.reservations.inc({ tool: 'refund', outcome: 'created' }, 2);
  m.auditLost.inc({ action: 'call' });
  m.gateCalls.inc({ tool: 'refund', outcome: 'allowed' });
  m.apiRequests.inc({ route: '/v1/calls', method: 'POST', status: '200' });
  m.apiSeconds.observe({ route: '/v1/calls', method: 'POST' }, 0.02);
  recordExemplar(
    m.registry,
    'actionledger_api_request_seconds',
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    { route: '/v1/calls', method: 'POST' },
    0.02,
    'c'.repeat(32),
  );
  // A counter named without the suffix has it in both formats' sample names only where the format says so:
  // this one is registered with it, as all of this project's are.
  new Counter({ name: 'actionledger_test_things_total', help: 'test', registers: [m.registry] }).inc(3);
  return m;
}

t.test('one process: the same samples in both formats, counters with one _total', async (t) => {
  const m = processMetrics(null);
  await m.readLedger(() => Promise.resolve({ by_status: { pending: 1 }, outbox_depth: 1, oldest_pending_age_s: 4 }));
  const text = await m.exposition();
  const open = await m.openMetrics();
  t.match(open, /# EOF\n$/);
  t.match(open, /trace_id="c{32}"/, 'the exemplar is there');
  t.notMatch(open, /_total_total/, 'no counter renamed');
  const a = samples(text);
  t.ok(a.includes('actionledger_audit_lost_total{action="call",cluster="eu-1"} 1'), 'a counter');
  t.ok(
    a.some((s) => s.startsWith('actionledger_process_start_time_seconds{cluster="eu-1"} 1')),
    'the process start time',
  );
  t.ok(a.length > 20, 'a real exposition');
  t.same(samples(open), a, 'the same names, labels and values');
});

t.test("the fleet's merge: the same samples in both formats", async (t) => {
  const inputs = [
    await processMetrics(null).asJson(),
    await processMetrics('1').asJson(),
    await processMetrics('2').asJson(),
  ];
  const text = await AggregatorRegistry.aggregate(inputs).metrics();
  const open = await openMetricsText(inputs);
  t.notMatch(open, /_total_total/);
  t.match(open, /trace_id="c{32}"/);
  const a = samples(text);
  t.ok(a.includes('actionledger_reservations_total{cluster="eu-1",outcome="created",tool="refund",worker="1"} 2'));
  t.ok(a.includes('actionledger_test_things_total{cluster="eu-1",worker="2"} 3'), 'a real merge');
  t.same(samples(open), a);
});

t.test('which Accept headers get OpenMetrics, by quality', (t) => {
  t.equal(acceptsOpenMetrics('application/openmetrics-text;q=0.1, text/plain;q=1'), false, 'text preferred');
  t.equal(acceptsOpenMetrics('application/openmetrics-text;q=0.1, */*;q=0.5'), false, 'anything preferred');
  t.equal(acceptsOpenMetrics('text/plain;q=0.2, application/openmetrics-text;q=0.9'), true);
  t.equal(acceptsOpenMetrics('application/openmetrics-text, text/plain'), true, 'a tie: the one asked for by name');
  t.equal(acceptsOpenMetrics('application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.5'), true);
  t.equal(acceptsOpenMetrics('Application/OpenMetrics-Text; Q=0.3, text/*;q=0.4'), false, 'text/* preferred');
  t.end();
});
