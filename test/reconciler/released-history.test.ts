/**
 * The verifier's legal paths include a dispatcher's release of a claim it never sent (`executing -> pending`),
 * only under a `released:` reason.
 */
import t from 'tap';
import { historyProblems } from '../../reconciler/index.js';

t.test('executing -> pending is legal only as a release', (t) => {
  const path = (reason: string | undefined) => [
    { from_status: null, to_status: 'pending' as const, reason: 'reserved' },
    { from_status: 'pending' as const, to_status: 'executing' as const, reason: 'claimed' },
    { from_status: 'executing' as const, to_status: 'pending' as const, ...(reason === undefined ? {} : { reason }) },
    { from_status: 'pending' as const, to_status: 'executing' as const, reason: 'claimed' },
    { from_status: 'executing' as const, to_status: 'succeeded' as const, reason: 'provider_receipt' },
  ];
  t.same(historyProblems(path('released:storage_full'), 'succeeded'), [], 'a release');
  t.match(historyProblems(path('claimed'), 'succeeded'), [{ kind: 'illegal_transition' }], 'any other reason');
  t.match(historyProblems(path(undefined), 'succeeded'), [{ kind: 'illegal_transition' }], 'no reason given');
  t.end();
});
