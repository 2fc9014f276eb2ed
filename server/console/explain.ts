/** A refusal as a person reads it: its stable code, the library's message, and what it means for them. */
import type { ActionLedgerError } from '../../core/errors.js';
import { html, type SafeHtml } from './html.js';
import { notice } from './layout.js';

const MEANING: Partial<Record<string, string>> = {
  self_approval_forbidden:
    'The person who asked never approves their own request, and nobody counts twice: another approver must decide it.',
  permission_denied:
    'None of the roles you hold in this tenant may do this (or one was revoked). The roles are granted with actionledger principal grant.',
  approval_hash_mismatch:
    'What you were shown is not what is stored now. Reload the approval, read it again and decide on what it says.',
  reapproval_required:
    'What was approved no longer holds (a bound resource, the plan, the policy or a limit moved). Nothing was done; the requester must ask again.',
  approval_expired: 'The approval passed its time to live; the requester must ask again.',
  invalid_state_transition: 'It is no longer in a state that allows this; reload to see where it is now.',
  csrf_token_invalid: 'The form did not carry your session’s token. Reload the page and act from it.',
  oidc_sign_in_failed:
    'The identity provider’s answer did not hold up, so nobody was signed in. Start again from the sign-in page.',
  oidc_not_mapped:
    'The identity provider knows you, but the console’s mapping gives you no role. An operator adds a rule to api.console.oidc.',
  retry_not_safe:
    'The provider may have received the request: a retry could apply it twice. Find out what the provider did, then resolve it.',
  tool_disabled: 'A kill switch holds this tool; lift it first (Kill switches).',
  not_found: 'There is no such item in your tenants.',
  invalid_request: 'The form is incomplete or malformed.',
};

export function explain(err: Pick<ActionLedgerError, 'code' | 'message' | 'details'>, status?: number): SafeHtml {
  const meaning = MEANING[err.code];
  return notice(
    'bad',
    html`<p><span class="code">${err.code}</span>${status === undefined ? '' : ` (HTTP ${status})`}: ${err.message}</p>
      ${meaning === undefined ? '' : html`<p>${meaning}</p>`}`,
  );
}
