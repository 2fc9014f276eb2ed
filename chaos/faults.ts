/**
 * Each operation's provider, authorizer and readback faults, chosen from the run's seed and keyed by effect
 * key, and installed once on the sandbox provider and authorizer (whose selectors consult this plan, so an
 * operation can get its faults after the injection, and lose them before the reviewer retries it).
 */
import type { ProviderFault, SandboxAuthorizer, SandboxProvider } from '../sandbox/index.js';
import type { Rng } from './rng.js';

const PROVIDER_FAULTS = [
  'timeout',
  'status500',
  'status429',
  'slowDrip',
  'oversized',
  'duplicateKeyJson',
  'commitThenReset',
  'resetBeforeCommit',
  'hangHeaders',
] as const;
type ProviderFaultName = (typeof PROVIDER_FAULTS)[number];
const AUTH_FAULTS = ['deny', 'slow', 'stale'] as const;
type AuthFaultName = (typeof AUTH_FAULTS)[number];

function providerFault(name: ProviderFaultName): ProviderFault {
  switch (name) {
    case 'status500':
      return { kind: 'status', status: 500 };
    case 'status429':
      return { kind: 'status', status: 429 };
    case 'slowDrip':
      return { kind: 'slowDrip', intervalMs: 5 };
    case 'oversized':
      return { kind: 'oversized', bytes: 64 * 1024 };
    default:
      return { kind: name };
  }
}

/**
 * The authorizer's answers the run gives deliberately and for good: a denial, and a decision dated outside the
 * profile's window. An operation they hit is refused by a decision, so it ends in review by design; every other
 * fault is a blip, which strikes a few attempts and is gone.
 */
export const DELIBERATE_AUTH_FAULTS: readonly AuthFaultName[] = ['deny', 'stale'];

/**
 * The review reasons the deliberate faults lead to (and the gate faults' role revocations): the chaos run counts
 * operations in review for these apart from the rest, which self-healing should have kept out of review.
 */
export const DELIBERATE_REVIEW_REASONS: readonly string[] = [
  'authorization:authorization_denied',
  'authorization:authorization_stale',
  'final_check:role_revoked',
];

export class FaultPlan {
  readonly #provider = new Map<string, ProviderFaultName>();
  readonly #auth = new Map<string, AuthFaultName>();
  /** Attempts a blip (a provider fault, a slow authorizer) still strikes, per key. */
  readonly #strikes = new Map<string, { provider: number; auth: number }>();
  /** Readbacks still to fail, per key. */
  readonly #readback = new Map<string, number>();

  /**
   * Draws one operation's faults: a provider fault 35% of the time, an authorizer fault 10%, 1-3 failing readbacks
   * 15%. A provider fault or a slow authorizer strikes 1-2 attempts of the operation (a blip: an outage of the
   * provider or the authorizer that passes); a denial or a stale decision stays.
   */
  choose(effectKey: string, rng: Rng): void {
    if (rng.chance(0.35)) this.#provider.set(effectKey, rng.pick(PROVIDER_FAULTS));
    if (rng.chance(0.1)) this.#auth.set(effectKey, rng.pick(AUTH_FAULTS));
    if (rng.chance(0.15)) this.#readback.set(effectKey, rng.int(1, 3));
    this.#strikes.set(effectKey, { provider: rng.int(1, 2), auth: rng.int(1, 2) });
  }

  /** Whether the blip of `kind` still strikes this attempt of `key` (and counts the strike). */
  #strike(key: string, kind: 'provider' | 'auth'): boolean {
    const left = this.#strikes.get(key);
    if (left === undefined || left[kind] <= 0) return false;
    left[kind]--;
    return true;
  }

  /** Whether the operation of this key met a deliberate authorizer fault. */
  deliberate(effectKey: string): boolean {
    const f = this.#auth.get(effectKey);
    return f !== undefined && DELIBERATE_AUTH_FAULTS.includes(f);
  }

  /** No more provider or authorizer faults for this operation (it is retried after the faults stopped). */
  forget(effectKey: string): void {
    this.#provider.delete(effectKey);
    this.#auth.delete(effectKey);
  }

  install(provider: SandboxProvider, authorizer: SandboxAuthorizer): void {
    for (const name of PROVIDER_FAULTS)
      provider.inject(providerFault(name), {
        times: Infinity,
        when: (k) => this.#provider.get(k) === name && this.#strike(k, 'provider'),
      });
    provider.inject(
      { kind: 'readbackFailing' },
      {
        times: Infinity,
        when: (k) => {
          const n = this.#readback.get(k) ?? 0;
          if (n > 0) this.#readback.set(k, n - 1);
          return n > 0;
        },
      },
    );
    authorizer.inject({ kind: 'deny' }, { times: Infinity, when: (r) => this.#auth.get(r.effect_key) === 'deny' });
    authorizer.inject(
      { kind: 'slow', delayMs: 800 },
      { times: Infinity, when: (r) => this.#auth.get(r.effect_key) === 'slow' && this.#strike(r.effect_key, 'auth') },
    );
    authorizer.inject({ kind: 'stale' }, { times: Infinity, when: (r) => this.#auth.get(r.effect_key) === 'stale' });
  }

  summary(): string {
    return `provider ${this.#provider.size}, authorizer ${this.#auth.size}, readback failing ${this.#readback.size}`;
  }
}
