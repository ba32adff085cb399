// The impact view: pasted documents (YAML, as `verdictctl impact -f` reads
// them) and keys to delete → the flows whose answer the change would alter,
// before → after, grouped by the policy deciding them, the destination and
// the ports (AnalysisService.Impact; docs/analysis.md). Nothing is written:
// the documents are read by the explorer's documents call, and Impact judges
// the change on a copy of the snapshot, as Apply's dry run validates it.
//
// URL: ?view=impact&doc=<the YAML>&delete=KEY,KEY2&fleet=1
//      &gpage=2&cpage=3   later pages of the groups and of the changed flows

import { h, table, field, errorBox, enumText, dash, pageOf, pager } from '../dom.js';
import { endOf, decideHref, query } from '../ends.js';

// pageSize is the groups, and the changed flows, of one page: a change to
// a mesh of 10,000 policies can alter thousands of flows.
const pageSize = 100;

export default {
  name: 'impact',
  title: 'Impact',
  claims: (params) => params.has('doc') || params.has('delete'),
  async render(ctx) {
    const { params, root } = ctx;
    const yaml = params.get('doc') || '';
    const deletes = (params.get('delete') || '').split(',').map((k) => k.trim()).filter(Boolean);
    const fleet = params.get('fleet') === '1';
    const result = h('section', { id: 'impact-result', 'aria-live': 'polite', 'aria-labelledby': 'impact-title' });
    root.replaceChildren(h('h1', null, 'Impact of a change'), changeForm(yaml, deletes, fleet, ctx), result);
    if (!yaml.trim() && !deletes.length) {
      result.append(h('p', { class: 'hint', id: 'impact-title' },
        'Paste the documents you would apply, or name keys you would delete: the flows whose answer would change appear here. ',
        'Nothing is applied.'));
      return;
    }
    ctx.setTitle('Impact of a change');
    performance.mark('verdict:impact:start');
    let resp;
    try {
      const resources = yaml.trim() ? (await ctx.api.call('documents', { yaml })).resources : [];
      if (ctx.stale()) return;
      resp = await ctx.api.call('verdict.v1.AnalysisService/Impact', { resources, deletes, fleet });
    } catch (err) {
      if (err.status === 401 || ctx.stale()) throw err;
      result.append(h('h2', { id: 'impact-title', tabindex: '-1' }, 'The change cannot be judged'), errorBox(err));
      if (ctx.focus) document.getElementById('impact-title').focus();
      return;
    }
    if (ctx.stale()) return;
    const href = (key) => (k) => {
      const p = new URLSearchParams(params);
      p.set('view', 'impact');
      if (k > 1) p.set(key, String(k));
      else p.delete(key);
      return query(p);
    };
    result.append(...answer(resp, { g: params.get('gpage'), c: params.get('cpage'), gHref: href('gpage'), cHref: href('cpage') }));
    performance.measure('verdict:impact', 'verdict:impact:start');
    if (ctx.focus) document.getElementById('impact-title').focus();
  },
};

function changeForm(yaml, deletes, fleet, ctx) {
  const text = h('textarea', {
    id: 'impact-doc', rows: 14, cols: 80, spellcheck: 'false', class: 'mono',
    placeholder: 'kind: Policy\nmesh: shop\nname: freeze-db\n...',
  });
  text.value = yaml;
  const del = h('input', { id: 'impact-delete', value: deletes.join(','), class: 'wide', autocomplete: 'off', placeholder: 'shop/policies/TrafficPermission/old' });
  const fleetIn = h('input', { id: 'impact-fleet', type: 'checkbox', checked: fleet });
  return h('form', {
    class: 'query impact', 'aria-label': 'Change', id: 'impact-form',
    onsubmit: (e) => {
      e.preventDefault();
      ctx.navigate(new URLSearchParams([['view', 'impact'], ['doc', text.value], ['delete', del.value.trim()],
        ['fleet', fleetIn.checked ? '1' : '']]), { focus: true });
    },
  },
  field('Documents to apply (YAML)', text),
  h('div', { class: 'column' },
    field('Keys to delete (comma-separated)', del),
    h('div', { class: 'field check' }, fleetIn, h('label', { for: 'impact-fleet' }, 'replay every replica\'s observed flows')),
    h('button', { type: 'submit', class: 'primary', id: 'impact-submit' }, 'Preview')));
}

// answer shows an Impact answer: the count, the groups, and the changed
// flows under their group, a page of each (at.g, at.c; at.gHref(k) and
// at.cHref(k) are page k's URLs).
function answer(r, at) {
  const changes = r.changes || [];
  const groups = r.groups || [];
  const out = [
    h('h2', { id: 'impact-title', tabindex: '-1' },
      changes.length ? `${changes.length} flow${changes.length === 1 ? '' : 's'} would change` : 'No flow would change'),
    h('p', { class: 'meta', id: 'impact-meta' },
      `judged against revision ${dash(r.revision)}: ${dash(r.considered)} flows considered, ${dash(r.redecided)} decided before and after; nothing was written`),
  ];
  if (r.replicas?.length) {
    out.push(table('Replicas whose observed flows were replayed', ['Replica', 'Address', 'Flows', 'Error'],
      r.replicas.map((x) => [`${x.id}${x.self ? ' (this one)' : ''}`, dash(x.address), dash(x.flows), x.error ? h('span', { class: 'act-deny' }, x.error) : '-']),
      { id: 'impact-replicas' }));
  }
  if (!changes.length) return out;
  const gp = pageOf(groups, at.g, pageSize);
  out.push(table(`Changed flows by deciding policy, destination and ports${gp.pages > 1 ? `, page ${gp.n} of ${gp.pages}` : ''}`,
    ['Policy', 'Destination', 'Ports', 'Flows', 'Observed'],
    gp.items.map((g) => [h('code', null, dash(g.policy)), g.destination, classText(g.protocol, g.portLo, g.portHi), dash(g.flows), dash(g.observed)]),
    { id: 'impact-groups' }));
  if (gp.pages > 1) out.push(pager('Pages of groups', 'groups', gp, groups.length, at.gHref, 'impact-groups'));
  // The changes in the groups' order, a page of them under their groups.
  const byGroup = new Map(groups.map((g) => [groupKey(g.policy, g.destination, g.protocol, g.portLo, g.portHi), []]));
  for (const c of changes) {
    const k = changeGroup(c);
    if (!byGroup.has(k)) byGroup.set(k, []);
    byGroup.get(k).push(c);
  }
  const cp = pageOf([...byGroup.values()].flat(), at.c, pageSize);
  byGroup.clear();
  for (const c of cp.items) {
    const k = changeGroup(c);
    if (!byGroup.has(k)) byGroup.set(k, []);
    byGroup.get(k).push(c);
  }
  const counts = new Map(groups.map((g) => [groupKey(g.policy, g.destination, g.protocol, g.portLo, g.portHi), g.flows]));
  const head = ['Source', 'Destination', 'Ports', 'Before', '', 'After', 'Observed', 'Flow now'];
  const bodies = [];
  for (const [k, cs] of byGroup) {
    if (!cs.length) continue;
    const [policy, dst, proto, lo, hi] = k.split('\u0000');
    bodies.push(h('tbody', null,
      h('tr', null, h('th', { scope: 'rowgroup', colspan: head.length, class: 'group' },
        `${policy || 'no policy'} · ${dst} · ${classText(proto, lo, hi)}: ${flowsText(counts.get(k) ?? cs.length)}`)),
      cs.map((c) => h('tr', { class: c.before?.action !== c.after?.action ? 'change action-changed' : 'change' },
        [endpointText(c.source), endpointText(c.destination), classText(c.protocol, c.portLo, c.portHi),
          answerCell(c.before), '→', answerCell(c.after), c.observed ? `${c.count} time${c.count === '1' ? '' : 's'}` : '-', flowLink(c)]
          .map((cell) => h('td', null, cell))))));
  }
  out.push(h('div', { class: 'scroll', id: 'impact-changes' }, h('table', null,
    h('caption', null, `The changed flows, before → after, under their group${cp.pages > 1 ? `, page ${cp.n} of ${cp.pages}` : ''}`),
    h('thead', null, h('tr', null, head.map((c) => h('th', { scope: 'col' }, c)))), bodies)));
  if (cp.pages > 1) out.push(pager('Pages of changed flows', 'flows', cp, changes.length, at.cHref, 'impact-changes'));
  return out;
}

const flowsText = (n) => `${n} flow${String(n) === '1' ? '' : 's'}`;

// changeGroup is the group a change is counted in, as the server groups it.
const changeGroup = (c) => groupKey(c.after?.policy || c.before?.policy || '', endpointText(c.destination), c.protocol, c.portLo, c.portHi);

const groupKey = (...parts) => parts.map((p) => String(p ?? '')).join('\u0000');

// endpointText is an endpoint as one word, as the server names a group's
// destination: a workload, an address, a principal, an identity, {tags}.
function endpointText(e) {
  if (!e) return '-';
  if (e.workload) return e.workload;
  if (e.address) return e.address;
  if (e.principal) return e.principal;
  if (e.identity && e.identity !== '0') return `identity ${e.identity}`;
  return `{${Object.keys(e.tags || {}).sort().map((k) => `${k}=${e.tags[k]}`).join(',')}}`;
}

// classText is a class of flows: "TCP 5432", "TCP 1-5431", "ICMP", "no protocol".
function classText(proto, lo, hi) {
  if (!proto) return 'no protocol';
  if (!Number(lo) && !Number(hi)) return proto;
  return Number(lo) === Number(hi) ? `${proto} ${lo}` : `${proto} ${lo}-${hi}`;
}

function answerCell(a) {
  if (!a) return '-';
  if (a.error) return h('span', { class: 'hint' }, a.error);
  const act = enumText(a.action, 'ACTION_');
  return h('span', null, h('span', { class: act === 'ALLOW' ? 'act-allow' : act === 'DENY' ? 'act-deny' : null }, act),
    a.policy ? [' by ', h('code', null, a.policy)] : '');
}

// flowLink is the decide view of the changed flow as the store answers it
// now (its before): the class's port stands for the class.
function flowLink(c) {
  const src = endOf(c.source);
  const dst = endOf(c.destination);
  if (!src || !dst) return '-';
  return h('a', {
    href: decideHref({ mesh: c.mesh, type: c.type, src, dst, proto: c.protocol, port: c.port }),
    'aria-label': `decide ${endpointText(c.source)} → ${endpointText(c.destination)} ${classText(c.protocol, c.port, c.port)} now`,
  }, 'decide');
}
