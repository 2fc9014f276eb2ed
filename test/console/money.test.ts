/**
 * Money as the console shows it (server/console/money.ts): major units with ISO 4217's decimals, exactly, and
 * the stored minor units beside; a currency outside ISO 4217, or a value that is not a safe integer, is never
 * read into a decimal.
 */
import t from 'tap';
import { minorDigits, money } from '../../server/console/money.js';

t.test("ISO 4217's decimals, where the ICU data behind Intl gives cash decimals", (t) => {
  // Intl.NumberFormat says 0 for IDR, HUF, COP and PKR and 0 for IQD: the amounts would read 100 or 1000 times
  // too large.
  t.same(money(1000, 'IDR'), { major: 'IDR 10.00', minor: '1000 minor units' });
  t.same(money(1000, 'IQD'), { major: 'IQD 1.000', minor: '1000 minor units' });
  t.same(money(123456, 'HUF'), { major: 'HUF 1,234.56', minor: '123456 minor units' });
  for (const code of ['AFN', 'ALL', 'COP', 'IRR', 'KPW', 'LAK', 'LBP', 'MGA', 'MMK', 'PKR', 'SOS', 'SYP', 'YER'])
    t.equal(minorDigits(code), 2, code);
  t.end();
});

t.test('0, 2, 3 and 4 decimals, exact for any safe integer, negative amounts too', (t) => {
  t.same(money(9900, 'EUR'), { major: 'EUR 99.00', minor: '9900 minor units' });
  t.same(money(9900, 'JPY'), { major: 'JPY 9,900', minor: '9900 minor units' });
  t.same(money(1234, 'KWD'), { major: 'KWD 1.234', minor: '1234 minor units' });
  t.same(money(5, 'CLF'), { major: 'CLF 0.0005', minor: '5 minor units' });
  t.same(money(7, 'EUR'), { major: 'EUR 0.07', minor: '7 minor units' });
  t.same(money(-150, 'EUR'), { major: '-EUR 1.50', minor: '-150 minor units' });
  t.same(money(Number.MAX_SAFE_INTEGER, 'USD'), {
    major: 'USD 90,071,992,547,409.91',
    minor: '9007199254740991 minor units',
  });
  t.end();
});

t.test('a code outside ISO 4217 money is shown as the integer it is, never given decimals', (t) => {
  for (const code of ['XYZ', 'XAU', 'XXX', 'XTS', 'eur', 'EURO', ''])
    t.same(
      money(1000, code),
      { major: `1000 ${code}`.trim(), minor: 'minor units of a currency not in ISO 4217' },
      code,
    );
  t.equal(minorDigits('toString'), null, 'no inherited property counts as a currency');
  t.end();
});

t.test('a value that is not a safe integer is shown as written and says so', (t) => {
  const asWritten = 'as written: not read as minor units';
  t.same(money(99.5, 'EUR'), { major: '99.5 EUR', minor: asWritten });
  t.same(money(2 ** 53, 'EUR'), { major: '9007199254740992 EUR', minor: asWritten });
  t.same(money('9900', 'EUR'), { major: '9900 EUR', minor: asWritten });
  t.same(money(null, 'EUR'), { major: 'null EUR', minor: asWritten });
  t.same(money({ v: 1 }, 'EUR'), { major: '{"v":1} EUR', minor: asWritten });
  t.end();
});
