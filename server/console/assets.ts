/**
 * The console's two static files, served from memory under /console/static/ (so a packaged install needs no
 * extra files): the stylesheet and one small ES module. The pages work without the module; with it, every
 * element marked `data-live` is refreshed in place from the same URL the page came from, 4 s after the last
 * refresh finished and not while the page is hidden (the server renders and escapes it; the module only moves
 * parsed nodes, it never builds markup from data).
 */
export const CONSOLE_JS = `// actionledger console: live regions (no inline script: the page's CSP is default-src 'self').
const regions = [...document.querySelectorAll('[data-live]')];
async function refresh() {
  const abort = new AbortController();
  const limit = setTimeout(() => abort.abort(), 20000);
  try {
    const res = await fetch(location.href, {
      credentials: 'same-origin',
      headers: { 'x-console-live': '1' },
      signal: abort.signal,
    });
    if (res.status === 401 || res.redirected) { location.reload(); return; }
    if (!res.ok) return;
    const doc = new DOMParser().parseFromString(await res.text(), 'text/html');
    for (const region of regions) {
      const fresh = doc.getElementById(region.id);
      if (fresh === null) continue;
      const active = document.activeElement;
      if (active !== null && active !== document.body && region.contains(active)) continue;
      region.replaceChildren(...[...fresh.childNodes].map((n) => document.importNode(n, true)));
    }
  } catch {
    // offline for a moment, or no answer within 20 s: the next refresh tries again
  } finally {
    clearTimeout(limit);
  }
}
// One request at a time: the next refresh is set 4 s after the last one finished, and none while the page is
// hidden (a background tab); shown again, it refreshes at once.
let timer = null;
let busy = false;
function later() {
  clearTimeout(timer);
  timer = null;
  if (!busy && !document.hidden) timer = setTimeout(poll, 4000);
}
async function poll() {
  clearTimeout(timer);
  timer = null;
  if (busy || document.hidden) return;
  busy = true;
  try {
    await refresh();
  } finally {
    busy = false;
    later();
  }
}
if (regions.length > 0) {
  document.addEventListener('visibilitychange', () => (document.hidden ? later() : void poll()));
  later();
}
`;

export const CONSOLE_CSS = `
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --bad: #a40e26; --ok: #116329; --warn: #7d4e00; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); }
header { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: center; padding: .6rem 1rem;
  border-bottom: 1px solid var(--line); }
header nav { display: flex; flex-wrap: wrap; gap: .25rem .9rem; }
header .who { margin-left: auto; display: flex; gap: .5rem; align-items: center; }
main { padding: 1rem; max-width: 72rem; overflow-wrap: break-word; }
a { color: #0550ae; }
a:focus, button:focus, input:focus, select:focus, textarea:focus { outline: 3px solid #0969da; outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f8fa; padding: .75rem; border: 1px solid var(--line); }
.hidden-char { font-family: ui-monospace, monospace; background: #fff3bf; color: #7a2e00; border: 1px dashed #b35900; padding: 0 .15em; }
.logical-order { unicode-bidi: bidi-override; direction: ltr; outline: 1px dashed #b35900; }
.hash { font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
.notice { padding: .6rem .8rem; border: 1px solid var(--line); border-left-width: 5px; margin: .8rem 0; }
.notice.bad { border-left-color: var(--bad); } .notice.ok { border-left-color: var(--ok); }
.notice.warn { border-left-color: var(--warn); }
.code { font-family: ui-monospace, monospace; font-weight: 600; }
form.inline { display: inline; }
form.filters { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin-bottom: 1rem; }
label { display: flex; flex-direction: column; gap: .15rem; font-size: .9rem; }
input, select, textarea, button { font: inherit; padding: .3rem .5rem; }
button { cursor: pointer; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; }
dt { color: var(--muted); } dd { margin: 0; overflow-wrap: anywhere; }
ol.timeline li { margin-bottom: .4rem; }
button.primary { background: #1f883d; color: #fff; border: 1px solid #1a7f37; border-radius: 6px; font-weight: 600;
  padding: .45rem .9rem; }
button.primary:hover { background: #1a7f37; }
button.danger { background: #fff; color: var(--bad); border: 1px solid var(--bad); border-radius: 6px; }
button.danger:hover { background: #ffebe9; }
section.decide { display: flex; flex-wrap: wrap; gap: 1rem 2rem; align-items: flex-start; }
section.decide h2 { flex-basis: 100%; margin-bottom: 0; }
section.decide form { display: flex; flex-direction: column; gap: .5rem; }
.muted { color: var(--muted); } .bad { color: var(--bad); }
.money small { color: var(--muted); }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(10.5rem, 1fr)); gap: .75rem; margin: 1rem 0; }
.tile { border: 1px solid var(--line); border-radius: 6px; padding: .6rem .8rem; display: flex; flex-direction: column; }
.tile .label, .tile .note { color: var(--muted); font-size: .85rem; }
.tile strong { font-size: 1.6rem; line-height: 1.2; }
.chart { min-height: 200px; border: 1px solid var(--line); border-radius: 6px; padding: .5rem; }
.columns { display: grid; grid-template-columns: minmax(12rem, 1fr) 2fr; gap: 0 2rem; }
table.counts { width: auto; } table.counts th { font-weight: normal; color: var(--muted); padding-right: 2rem; }
table.audit td { white-space: nowrap; } table.audit td.detail { white-space: normal; max-width: 28rem; }
table.audit details pre { margin: .3rem 0 0; max-height: 24rem; overflow: auto; }
table.audit summary { cursor: pointer; color: var(--muted); overflow: hidden; text-overflow: ellipsis; }
.confirm { border: 2px solid var(--bad); border-radius: 6px; padding: .5rem 1rem; }
@media (max-width: 40rem) {
  header, td, th, dd, li, p { overflow-wrap: anywhere; }
  table, thead, tbody, tr, th, td { display: block; }
  thead { display: none; }
  tr { border-bottom: 2px solid var(--line); padding: .4rem 0; }
  td { border: 0; padding: .15rem 0; }
  td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); }
  dl { grid-template-columns: 1fr; }
  .columns { grid-template-columns: 1fr; }
  table.counts tr { display: flex; justify-content: space-between; border-bottom: 1px solid var(--line); }
  table.counts th, table.counts td { display: block; border: 0; }
  table.audit td { white-space: normal; }
}
`;
