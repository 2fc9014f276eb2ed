/**
 * Adversarial review of the MCP server: each test states the behaviour a safe server must have, and fails
 * while the flaw it names is present.
 */
import t from 'tap';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { MAX_SESSIONS_PER_PRINCIPAL } from '../../server/mcp/http.js';
import { apiFixture } from '../helpers/api.js';
import { count } from '../helpers/gate.js';
import { call, mcpClient, meta } from '../helpers/mcp.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };
const HEADERS = {
  accept: 'application/json, text/event-stream',
  'content-type': 'application/json',
  'mcp-protocol-version': '2025-06-18',
};
const sessionOf = (c: Client): string =>
  (c as unknown as { transport: { sessionId?: string } }).transport.sessionId ?? '';

t.test('a host that sets no turn_id: the model cannot confirm its own proposal in its next call', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  // The host sets task and step (required) but no turn: every request is then a turn of its own.
  const held = await call(client, 'send_email', EMAIL, meta('e-1'));
  t.match(held, { isError: true, body: { error: 'confirmation_required', confirm_token: String } });
  // The model, never having asked anyone, calls the built-in right away with the token it was handed.
  const self = await call(
    client,
    'actionledger_confirm_proposal',
    { confirm_token: held.body.confirm_token },
    meta('e-1'),
  );
  t.equal(self.isError, true, 'a confirmation with no user turn between must be refused');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved without the user');
});
