/**
 * Amounts as a person reads them. A tool's value argument (config `gate.tools.<name>.value`) is an integer in
 * the currency's minor units (`9900` EUR is 99.00 EUR; the caps and the approval threshold are kept in the same
 * units): shown in major units with the currency's own number of decimals (ISO 4217, as `Intl.NumberFormat`
 * knows it: 2 for EUR, 0 for JPY, 3 for KWD), and the stored minor units beside it, so nothing is lost.
 */

/** The currency's decimals (its minor unit), or null for a code `Intl` does not know. */
export function minorDigits(currency: string): number | null {
  if (!/^[A-Z]{3}$/.test(currency)) return null;
  try {
    return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits ?? null;
  } catch {
    return null;
  }
}

/** `minor` (an integer) as a decimal string in major units, exactly (no floating point). */
function majorString(minor: bigint, digits: number): string {
  const sign = minor < 0n ? '-' : '';
  const abs = (minor < 0n ? -minor : minor).toString().padStart(digits + 1, '0');
  return digits === 0 ? `${sign}${abs}` : `${sign}${abs.slice(0, -digits)}.${abs.slice(-digits)}`;
}

export interface Money {
  /** `EUR 99.00`: major units and the currency code, or the raw value and currency when either is not known. */
  major: string;
  /** `9900 minor units`, or null when the amount is not an integer in a known currency. */
  minor: string | null;
}

/** An amount in minor units with its currency, as shown: see the module comment. */
export function money(amount: unknown, currency: string): Money {
  const digits = minorDigits(currency);
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount) || digits === null)
    return {
      major: `${typeof amount === 'string' ? amount : JSON.stringify(amount ?? '')} ${currency}`.trim(),
      minor: null,
    };
  const fmt = new Intl.NumberFormat('en', {
    style: 'currency',
    currency,
    currencyDisplay: 'code',
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
  // format() takes a decimal string exactly (Intl.NumberFormat v3); the no-break space it puts after the code
  // would be shown as a hidden character by the console's escaping: it becomes a plain space.
  const major = fmt.format(majorString(BigInt(amount), digits) as unknown as number).replace(/\u00A0/g, ' ');
  return { major, minor: `${amount} minor units` };
}
