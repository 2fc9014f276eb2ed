/**
 * Amounts as a person reads them. A tool's value argument (config `gate.tools.<name>.value`) is an integer in
 * the currency's minor units (`9900` EUR is 99.00 EUR; the caps and the approval threshold are kept in the same
 * units): shown in major units with the currency's own number of decimals, and the stored minor units beside it,
 * so nothing is lost.
 *
 * The decimals come from ISO 4217's list of minor units, written out below, not from `Intl`: the ICU data behind
 * `Intl.NumberFormat` gives the decimals people write in cash, which for IDR, HUF, COP, PKR and a dozen more is 0
 * where ISO says 2 (and 0 for IQD where ISO says 3), so 1000 minor units of IDR would read as "IDR 1,000", a
 * hundred times too much. A code not on the list (a typo, a test code, gold) has no minor unit to divide by: the
 * amount is shown as the integer it is, labelled as minor units of an unknown currency, never guessed into a
 * decimal. An amount that is not a safe integer is shown as it was written, labelled as not read as minor units.
 */

/** ISO 4217 currencies whose minor unit is not 2 decimals (active codes and fund codes). */
const NOT_TWO: Readonly<Record<string, number>> = {
  BIF: 0,
  CLP: 0,
  DJF: 0,
  GNF: 0,
  ISK: 0,
  JPY: 0,
  KMF: 0,
  KRW: 0,
  PYG: 0,
  RWF: 0,
  UGX: 0,
  UYI: 0,
  VND: 0,
  VUV: 0,
  XAF: 0,
  XOF: 0,
  XPF: 0,
  BHD: 3,
  IQD: 3,
  JOD: 3,
  KWD: 3,
  LYD: 3,
  OMR: 3,
  TND: 3,
  CLF: 4,
  UYW: 4,
};

/** ISO 4217 currencies with 2 decimals (active codes, fund codes, and codes withdrawn recently enough to be stored). */
const TWO = new Set(
  (
    'AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD BTN BWP BYN BZD CAD CDF CHE ' +
    'CHF CHW CNY COP COU CRC CUC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ GYD HKD ' +
    'HNL HRK HTG HUF IDR ILS INR IRR JMD KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP ' +
    'MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR SBD SCR ' +
    'SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS UAH USD USN UYU UZS VED ' +
    'VES WST XCD XCG YER ZAR ZMW ZWG ZWL'
  ).split(' '),
);

/** The currency's decimals (its ISO 4217 minor unit), or null for a code that is not an ISO 4217 money code. */
export function minorDigits(currency: string): number | null {
  if (Object.hasOwn(NOT_TWO, currency)) return NOT_TWO[currency] ?? null;
  return TWO.has(currency) ? 2 : null;
}

/** `minor` (an integer) as a decimal string in major units, exactly (no floating point). */
function majorString(minor: bigint, digits: number): string {
  const sign = minor < 0n ? '-' : '';
  const abs = (minor < 0n ? -minor : minor).toString().padStart(digits + 1, '0');
  return digits === 0 ? `${sign}${abs}` : `${sign}${abs.slice(0, -digits)}.${abs.slice(-digits)}`;
}

export interface Money {
  /** `EUR 99.00`: major units and the currency code; or the value as stored and the currency when not known. */
  major: string;
  /** `9900 minor units`, or what the value is when it could not be read in major units. */
  minor: string;
}

/** An amount in minor units with its currency, as shown: see the module comment. */
export function money(amount: unknown, currency: string): Money {
  const raw = typeof amount === 'string' ? amount : JSON.stringify(amount ?? null);
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount))
    return { major: `${raw} ${currency}`.trim(), minor: 'as written: not read as minor units' };
  const digits = minorDigits(currency);
  if (digits === null)
    return { major: `${amount} ${currency}`.trim(), minor: 'minor units of a currency not in ISO 4217' };
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
