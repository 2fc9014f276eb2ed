/**
 * A real OpenID Connect provider for the console's single sign-on tests: `oidc-provider` (a certified
 * implementation) on a free loopback port, with one confidential client and its own development login and
 * consent pages (any login name signs in as the account of that name). Each account's claims are the test's
 * (`accounts`), and the ID token carries them (groups, email, name), as a provider configured to put them there
 * does.
 */
import { createServer, type Server } from 'node:http';
import type { Test } from 'tap';
import Provider from 'oidc-provider';
import type { Page } from 'playwright-core';
import { freePort } from './net.js';

export const CLIENT_ID = 'actionledger-console';
export const CLIENT_SECRET = 'console-client-secret-for-tests-0123456789';

export interface TestIdp {
  issuer: string;
  /** The claims each account signs in with (the account id is its `sub`); change them between sign-ins. */
  accounts: Map<string, Record<string, unknown>>;
}

export async function oidcProvider(t: Test, redirectUris: string[]): Promise<TestIdp> {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const accounts = new Map<string, Record<string, unknown>>();
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: CLIENT_ID,
        client_secret: CLIENT_SECRET,
        redirect_uris: redirectUris,
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'preferred_username'],
      groups: ['groups'],
    },
    // The claims go into the ID token itself, which is what the console reads.
    conformIdTokenClaims: false,
    cookies: { keys: ['oidc-provider-test-cookie-key'] },
    findAccount: (_ctx, id) => ({
      accountId: id,
      claims: () => ({ sub: id, ...accounts.get(id) }),
    }),
  });
  const handle = provider.callback();
  const server: Server = createServer((req, res) => void handle(req, res));
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return { issuer, accounts };
}

/** Signs in at the provider's development pages as `login` and consents; the page then goes back to the console. */
export async function providerLogin(page: Page, login: string): Promise<void> {
  await page.waitForSelector('input[name=login]');
  await page.fill('input[name=login]', login);
  await page.fill('input[name=password]', 'any');
  await page.click('button[type=submit]');
  // The consent page, unless the provider remembers the grant; either way the browser then leaves for the console.
  const consent = page.locator('input[name=prompt][value=consent]');
  await consent.or(page.locator('main')).first().waitFor({ state: 'attached' });
  if ((await consent.count()) > 0) await page.click('button[type=submit]');
}
