import t from 'tap';
import { readFileSync } from 'node:fs';
import { compileConfig, loadConfig, quoteSchemaName } from '../../config/index.js';
import { resolveEffectKeySecrets } from '../../config/keys.js';

const tool = {
  provider_id: 'billing',
  endpoint: 'https://billing.example.org/v3/refunds',
  allowed_tenants: ['tenant-a'],
  idempotency: { mechanism: 'header', name: 'Idempotency-Key' },
};

t.test('the shipped example configuration compiles and routes issue_refund for tenant-a', (t) => {
  const cfg = loadConfig({ ACTIONLEDGER_CONFIG: 'actionledger.config.json' });
  const route = cfg.tools.get('issue_refund');
  t.ok(route?.allowedTenants.has('tenant-a'));
  t.equal(cfg.databaseUrl, null, 'no DATABASE_URL: embedded');
  t.equal(cfg.http.port, 7420);
  t.equal(loadConfig({ PORT: '8080' }).http.port, 8080);
  t.ok(Object.isFrozen(cfg));
  t.match(readFileSync('actionledger.config.json', 'utf8'), /secret_env/, 'secrets only by environment variable name');
  t.end();
});

t.test('every problem is listed at once', (t) => {
  const err = (() => {
    try {
      compileConfig(
        {
          schema: 'Bad-Name',
          http: { port: 99999 },
          bogus: 1,
          tools: {
            a: { ...tool, endpoint: 'http://billing.example.org/x' },
            b: { ...tool, endpoint: 'https://Billing.example.org/x' },
            c: { ...tool, endpoint: 'https://billing.example.org:443/x' },
            d: { ...tool, endpoint: 'https://user@billing.example.org/x' },
            e: { ...tool, endpoint: 'https://billing.example.org/x?q=1' },
            f: { ...tool, endpoint: 'https://billing.example.org/x#frag' },
            g: { ...tool, endpoint: 'https://billing.example.org\\x' },
          },
        },
        {},
      );
    } catch (e) {
      return e as { code: string; details: { problems: string[] } };
    }
    return undefined;
  })();
  t.equal(err?.code, 'config_invalid');
  t.ok((err?.details.problems.length ?? 0) >= 2, 'schema problems listed together');

  const endpoints = (() => {
    try {
      compileConfig(
        {
          schema: 'Bad-Name',
          tools: Object.fromEntries(
            [
              'http://b.example/x',
              'https://B.example/x',
              'https://b.example:443/x',
              'https://u@b.example/x',
              'https://b.example/x?q=1',
              'https://b.example/x#f',
              'https://b.example\\x',
              'https://b.example/a/../x',
            ].map((e, i) => [`t${i}`, { ...tool, endpoint: e }]),
          ),
        },
        {},
      );
    } catch (e) {
      return (e as { details: { problems: string[] } }).details.problems;
    }
    return [];
  })();
  t.equal(endpoints.length, 9, 'eight non-canonical endpoints and the schema name, all listed');
  t.match(endpoints.join('\n'), /schema/);
  t.end();
});

t.test('schema names are validated and quoted once', (t) => {
  t.equal(quoteSchemaName('actionledger'), '"actionledger"');
  for (const bad of ['a"b', 'A', 'pg_catalog', '', 'x;drop', 'a'.repeat(64)])
    t.throws(() => quoteSchemaName(bad), { code: 'schema_name_invalid' }, bad);
  t.end();
});

t.test('effect-key secrets: required with a real database, at least 32 bytes', (t) => {
  const cfg = compileConfig({ tools: { x: tool } }, { DATABASE_URL: 'postgres://x/y' });
  t.throws(() => resolveEffectKeySecrets(cfg, {}, { embedded: false }), { code: 'secret_missing' });
  t.throws(() => resolveEffectKeySecrets(cfg, { ACTIONLEDGER_EFFECT_KEY_SECRET: 'short' }, { embedded: false }), {
    code: 'secret_missing',
  });
  const keys = resolveEffectKeySecrets(cfg, { ACTIONLEDGER_EFFECT_KEY_SECRET: 'x'.repeat(32) }, { embedded: false });
  t.equal(keys.secrets.get('k1')?.byteLength, 32);
  t.equal(JSON.stringify(keys.secrets.get('k1')), '"[redacted]"');
  t.end();
});
