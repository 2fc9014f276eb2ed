/**
 * The service's listener (HttpServer, as `actionledger start` builds it) serves Slack's interactivity endpoint
 * with the signing secret read from the variable the configuration names, and refuses to start without it.
 */
import t, { type Test } from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from '../helpers/cli.js';
import { compileConfig } from '../../config/index.js';
import { openRuntime } from '../../runtime/runtime.js';
import { Secret } from '../../core/secret.js';
import { EffectKeyer, Ledger } from '../../ledger/index.js';
import { slackSignature } from '../../notifier/index.js';
import { HttpServer } from '../../server/index.js';
import { baseToolConfig, createTestDatabase, TEST_SECRET } from '../helpers/db.js';
import { freePort } from '../helpers/net.js';

const SLACK = {
  type: 'slack',
  channel: 'C1',
  team_id: 'T1',
  bot_token_env: 'SLACK_BOT_TOKEN',
  signing_secret_env: 'SLACK_SIGNING_SECRET',
  api_base_url: 'https://127.0.0.1:9/api',
  allow_private_network: true, // a loopback address
};

async function service(t: Test, extraEnv: Record<string, string>) {
  const url = await createTestDatabase(t);
  const env = { DATABASE_URL: url, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET, ...extraEnv };
  const port = await freePort();
  const config = compileConfig(
    { tools: baseToolConfig, http: { host: '127.0.0.1', port }, notifications: { destinations: { chat: SLACK } } },
    env,
  );
  const rt = await openRuntime({ name: 'test-slack', config, env, migrate: true, defaultMetrics: false });
  const ledger = new Ledger(rt.config, rt.pool, new EffectKeyer(rt.effectKeys));
  const server = new HttpServer({ runtime: rt, ledger, env });
  t.teardown(async () => {
    await server.stop();
    ledger.stop();
    await rt.close();
  });
  return { server, port };
}

t.test('the endpoint checks signatures with the configured secret', async (t) => {
  const { server, port } = await service(t, { SLACK_BOT_TOKEN: 'xoxb-1', SLACK_SIGNING_SECRET: 'sign-1' });
  await server.start();
  const body = 'payload=%7B%7D';
  const post = (secret: string) => {
    const ts = String(Math.floor(Date.now() / 1000));
    return fetch(`http://127.0.0.1:${port}/integrations/slack/chat/interactions`, {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        'x-slack-request-timestamp': ts,
        'x-slack-signature': slackSignature(new Secret(Buffer.from(secret)), ts, body),
      },
      body,
    });
  };
  const forged = await post('sign-2');
  t.equal(forged.status, 401, 'another secret: refused');
  const signed = await post('sign-1');
  t.equal(signed.status, 422, 'the configured secret: past the signature, refused for its empty payload');
  t.equal(((await signed.json()) as { error: string }).error, 'invalid_request');
});

t.test('without the signing secret in the environment the listener does not start', async (t) => {
  const { server } = await service(t, { SLACK_BOT_TOKEN: 'xoxb-1' });
  await t.rejects(server.start(), { code: 'secret_missing' });
});

t.test('`actionledger start` refuses a webhook secret it cannot read before it opens anything', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'al-notify-start-'));
  const cfg = join(dir, 'config.json');
  writeFileSync(
    cfg,
    JSON.stringify({
      tools: baseToolConfig,
      http: { port: 0 },
      notifications: {
        destinations: {
          hooks: {
            type: 'webhook',
            url: 'https://127.0.0.1:9/x',
            secret_envs: ['HOOKS_SECRET'],
            allow_private_network: true,
          },
        },
      },
    }),
  );
  const r = await runCli(['start'], {
    ACTIONLEDGER_CONFIG: cfg,
    ACTIONLEDGER_DATA_DIR: join(dir, 'data'),
    DATABASE_URL: 'postgres://nobody@127.0.0.1:9/none',
    ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET,
  });
  t.equal(r.code, 1, 'refused');
  t.match(r.stdout + r.stderr, /secret_missing[\s\S]*HOOKS_SECRET|HOOKS_SECRET[\s\S]*secret_missing/);
});
