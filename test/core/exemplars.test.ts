/**
 * Histogram exemplars (core/metrics.ts): recorded beside the registry, on its JSON buckets, put back after the
 * fleet's merge in the OpenMetrics exposition and never in the text one; and which Accept headers ask for
 * OpenMetrics (server/api/routes/system.ts).
 */
import t from 'tap';
import { Histogram } from 'prom-client';
import { Metrics, openMetricsText, recordExemplar } from '../../core/metrics.js';
import { acceptsOpenMetrics } from '../../server/api/routes/system.js';

const A = 'a'.repeat(32);
const B = 'b'.repeat(32);

function worker(slot: string): { m: Metrics; h: Histogram<'provider'> } {
  const m = new Metrics({ defaultMetrics: false, ledger: false });
  m.registry.setDefaultLabels({ worker: slot });
  const h = new Histogram({
    name: 'actionledger_test_seconds',
    help: 'test',
    labelNames: ['provider'],
    buckets: [0.1, 1],
    registers: [m.registry],
  });
  return { m, h };
}

t.test('exemplars: on the bucket the value fell in, in OpenMetrics only, kept through the merge', async (t) => {
  const one = worker('1');
  const two = worker('2');
  one.h.observe({ provider: 'p' }, 0.5);
  recordExemplar(one.m.registry, 'actionledger_test_seconds', [0.1, 1], { provider: 'p' }, 0.5, A);
  two.h.observe({ provider: 'p' }, 3);
  recordExemplar(two.m.registry, 'actionledger_test_seconds', [0.1, 1], { provider: 'p' }, 3, B);
  two.h.observe({ provider: 'p' }, 0.05);

  const text = await one.m.exposition();
  t.notMatch(text, /trace_id/, 'the text exposition has none');
  const merged = await openMetricsText([await one.m.asJson(), await two.m.asJson()]);
  t.match(merged, /# EOF\n$/);
  t.match(
    merged,
    new RegExp(
      `^actionledger_test_seconds_bucket\\{le="1",provider="p",worker="1"\\} 1 # \\{trace_id="${A}"\\} 0.5 `,
      'm',
    ),
    "worker 1's exemplar on its 1 s bucket",
  );
  t.match(
    merged,
    new RegExp(
      `^actionledger_test_seconds_bucket\\{le="\\+Inf",provider="p",worker="2"\\} 2 # \\{trace_id="${B}"\\} 3 `,
      'm',
    ),
    "worker 2's on its +Inf bucket",
  );
  t.match(merged, /^actionledger_test_seconds_bucket\{le="0.1",provider="p",worker="2"\} 1$/m, 'a bucket without one');
  t.equal((merged.match(/trace_id/g) ?? []).length, 2, 'no other exemplar');

  recordExemplar(one.m.registry, 'actionledger_test_seconds', [0.1, 1], { provider: 'p' }, 0.7, B);
  t.match(
    await one.m.openMetrics(),
    new RegExp(`le="1",provider="p",worker="1"\\} 1 # \\{trace_id="${B}"\\} 0.7 `),
    'the latest wins',
  );
});

t.test('which Accept headers ask for OpenMetrics', (t) => {
  t.equal(acceptsOpenMetrics(undefined), false);
  t.equal(acceptsOpenMetrics('text/plain'), false);
  t.equal(acceptsOpenMetrics('*/*'), false, 'anything: the text format');
  t.equal(acceptsOpenMetrics('application/openmetrics-text'), true);
  t.equal(
    acceptsOpenMetrics(
      'application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1',
    ),
    true,
    "Prometheus's header",
  );
  t.equal(acceptsOpenMetrics('application/openmetrics-text; q=0, text/plain'), false, 'q=0 refuses it');
  t.end();
});
