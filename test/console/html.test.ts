/**
 * The console's one escaping function: every interpolation of the `html` template is escaped, in text and in
 * double-quoted attributes, unless it is itself an `html` result; nothing else can make a SafeHtml; `href`
 * percent-encodes every path segment and query value.
 */
import t from 'tap';
import { escapeHtml, href, html, SafeHtml, text, visible } from '../../server/console/html.js';

t.test('every interpolation is escaped', (t) => {
  const hostile = `<script>alert(1)</script><img src=x onerror="alert('2')">\`&`;
  const out = html`<p title="${hostile}">${hostile}</p>`.toString();
  t.equal(
    out,
    '<p title="&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=&quot;alert(&#39;2&#39;)&quot;&gt;&#96;&amp;">' +
      '&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=&quot;alert(&#39;2&#39;)&quot;&gt;&#96;&amp;</p>',
  );
  t.notMatch(escapeHtml(hostile), /[<>"'`]/, 'no markup character survives');
  t.equal(
    html`${[hostile, html`<b>${'&'}</b>`, null, undefined, false, 3]}`.toString(),
    `${escapeHtml(hostile)}<b>&amp;</b>3`,
  );
  t.equal(html`${new Date(0)}`.toString(), '1970-01-01T00:00:00.000Z');
  t.end();
});

t.test('only html`` makes markup', (t) => {
  t.throws(() => new SafeHtml('<b>', Symbol('safe-html')), /made by html/);
  t.equal(text({ a: '<b>' }), '{"a":"<b>"}', 'JSON values become text to be escaped');
  t.equal(text(null), '');
  t.end();
});

t.test('href encodes every part', (t) => {
  t.equal(href(['approvals', 'tenant a', 'x/../y']), '/console/approvals/tenant%20a/x%2F..%2Fy');
  t.equal(href(['audit'], { tool: 'javascript:alert(1)', empty: '' }), '/console/audit?tool=javascript%3Aalert%281%29');
  t.end();
});

t.test('visible shows hidden characters as their codes and escapes the rest', (t) => {
  const out = visible('pay@\u202Emoc.xe-knab <b>\u200B\n\u{E0041}').toString();
  t.notOk(/[\u202E\u200B]|\u{E0041}/u.test(out), 'no hidden character is drawn raw');
  t.match(out, /pay@<span class="hidden-char"[^>]*>\\u202E<\/span>moc\.xe-knab &lt;b&gt;/);
  t.match(out, /\\u200B<\/span>\n<span/, 'a newline stays a newline');
  t.match(out, /\\u\{E0041\}<\/span>$/);
  t.equal(visible(undefined).toString(), '');
  t.end();
});

t.test('visible draws right-to-left text in the order it is stored', (t) => {
  const out = visible('IBAN \u05d0 1234 <5678>').toString();
  t.equal(
    out,
    '<bdo dir="ltr" class="logical-order" title="right-to-left text, shown in the order it is stored">IBAN \u05d0 1234 &lt;5678&gt;</bdo>',
  );
  t.match(
    visible('\u0627\u202e1').toString(),
    /^<bdo dir="ltr"[^>]*>\u0627<span class="hidden-char"[^>]*>\\u202E<\/span>1<\/bdo>$/,
  );
  t.equal(visible('Zürich 1234').toString(), 'Zürich 1234', 'left-to-right text as it is');
  t.end();
});
