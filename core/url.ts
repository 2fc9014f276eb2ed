/**
 * Canonical https endpoints. A route is bound into the ledger as text and compared byte for byte at dispatch,
 * so the configuration must spell each endpoint exactly one way: `https:`, a lower-case host, no userinfo,
 * query, fragment or backslash, and a port only when it is not 443. Anything else is refused, not rewritten:
 * a silently normalised URL would hide what the operator actually wrote.
 */
export function canonicalHttpsProblem(raw: string): string | null {
  if (raw.includes('\\')) return 'contains a backslash';
  if (/[\s\u0000-\u001f\u007f]/.test(raw)) return 'contains whitespace or control characters';
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return 'is not a URL';
  }
  if (url.protocol !== 'https:') return 'is not https';
  if (url.username !== '' || url.password !== '' || raw.includes('@')) return 'contains userinfo';
  if (url.search !== '' || raw.includes('?')) return 'contains a query';
  if (url.hash !== '' || raw.includes('#')) return 'contains a fragment';
  if (url.hostname === '') return 'has no host';
  if (url.href !== raw) return `is not in canonical form (expected ${url.href})`;
  return null;
}

export function isCanonicalHttps(raw: string): boolean {
  return canonicalHttpsProblem(raw) === null;
}
