/**
 * A tool's idempotency header may not be one the transport sets itself (config/routes.ts): the trace context
 * headers, the credential, the body's framing. Refused in any case, as config_invalid at the name's path.
 */
import t from 'tap';
import { baseToolConfig, testConfig } from '../helpers/db.js';

const URL_ = 'postgres://localhost/unused';

const withHeader = (name: string) => ({
  tools: {
    ...baseToolConfig,
    send_email: { ...baseToolConfig.send_email, idempotency: { mechanism: 'header', name } },
  },
});

t.test('reserved names are refused as the idempotency header, in any case', (t) => {
  for (const name of [
    'traceparent',
    'Traceparent',
    'TRACESTATE',
    'Authorization',
    'content-type',
    'Content-Length',
    'host',
    'Transfer-Encoding',
  ])
    t.throws(
      () => testConfig(URL_, withHeader(name)),
      {
        code: 'config_invalid',
        details: { issues: [{ path: '/tools/send_email/idempotency/name', message: /sets itself/ }] },
      },
      name,
    );
  t.equal(
    testConfig(URL_, withHeader('X-Idempotency-Key')).tools.get('send_email')?.idempotencyHeader,
    'X-Idempotency-Key',
    'any other name is kept as written',
  );
  t.end();
});
