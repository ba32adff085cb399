// The decide view: a flow → the final action and policy, both sides'
// answers, how each end resolved, and each side's candidate rules in order
// (what `verdictctl explain` prints; docs/explain.md). With rev=, as the
// store was at that revision (the revision bar sets it).
//
// URL: ?mesh=shop&type=TrafficPermission&src=workload:web-1&dst=workload:db-1&proto=TCP&port=5432&rev=12

import { h, table, field, errorBox, enumText, action, dash, tagsText } from '../dom.js';
import { forms, parseEnd, endpoint, formatEnd, query } from '../ends.js';
import { revisionBar } from './history.js';

const protocols = ['', 'TCP', 'UDP', 'ICMP'];

export default {
  name: 'decide',
  title: 'Decide',
  claims: (params) => params.has('src') || params.has('dst'),
  async render(ctx) {
    const { params, root } = ctx;
    const flow = readFlow(params);
    const result = h('section', { id: 'result', 'aria-live': 'polite', 'aria-labelledby': 'result-title' });
    root.replaceChildren(h('h1', null, 'Decide a flow'), flowForm(flow, ctx), revisionBar(ctx, flow.mesh), result);
    if (!params.get('src') || !params.get('dst')) {
      const missing = params.get('src') ? 'the destination' : params.get('dst') ? 'the source' : 'both ends of a flow';
      result.append(h('p', { class: 'hint', id: 'result-title' },
        `Name ${missing}: the answer, both sides, and every candidate rule in order appear here.`));
      return;
    }
    if (flow.error) {
      result.append(errorBox(flow.error));
      return;
    }
    ctx.setTitle(`${formatEnd(flow.src)} → ${formatEnd(flow.dst)}`);
    const req = {
      mesh: flow.mesh, type: flow.type, source: endpoint(flow.src), destination: endpoint(flow.dst),
      protocol: flow.proto, port: flow.port ? Number(flow.port) : 0,
    };
    if (flow.rev) req.atRevision = flow.rev;
    // The plain answer, which is cheap, is shown as soon as it comes; the
    // explained one (every candidate rule, which costs far more on a large
    // policy set) is asked for then, so as not to slow the first, and fills
    // in the trace and the ends' tags.
    performance.mark('verdict:decide:start');
    const method = 'verdict.v1.DecisionService/Decide';
    let resp;
    try {
      resp = await ctx.api.call(method, req);
    } catch (err) {
      if (err.status === 401 || ctx.stale()) throw err;
      result.append(errorBox(err));
      return;
    }
    if (ctx.stale()) return;
    const explained = ctx.api.call(method, { ...req, explain: true });
    explained.catch(() => {}); // awaited below
    result.append(...decision(flow, resp));
    performance.measure('verdict:decide', 'verdict:decide:start');
    if (ctx.focus) document.getElementById('result-title').focus();
    let ex;
    try {
      ex = await explained;
    } catch (err) {
      if (err.status === 401 || ctx.stale()) throw err;
      document.getElementById('trace').replaceChildren(errorBox(err));
      return;
    }
    if (ctx.stale()) return;
    if (ex.revision !== resp.revision) {
      // A newer snapshot answered the explained call: show its answer whole.
      const focused = document.activeElement?.id === 'result-title';
      result.replaceChildren(...decision(flow, ex));
      if (focused) document.getElementById('result-title').focus();
    } else {
      document.getElementById('ends').replaceWith(ends(flow, ex));
      document.getElementById('trace').replaceWith(traces(flow, ex));
    }
    performance.measure('verdict:explain', 'verdict:decide:start');
  },
};

// readFlow reads the flow of the URL; error says what is wrong with it.
function readFlow(params) {
  const flow = {
    mesh: params.get('mesh') || '', type: params.get('type') || '',
    proto: (params.get('proto') || '').toUpperCase(), port: params.get('port') || '',
    src: { form: 'workload', value: '' }, dst: { form: 'workload', value: '' },
    rev: params.get('rev') || '',
  };
  try {
    for (const end of ['src', 'dst']) {
      const v = params.get(end);
      if (v) flow[end] = parseEnd(v);
    }
    if (flow.rev !== '' && !/^[1-9][0-9]*$/.test(flow.rev)) throw new Error(`rev "${flow.rev}": a revision number from 1`);
    if (!protocols.includes(flow.proto)) throw new Error(`proto "${flow.proto}": TCP, UDP or ICMP`);
    if (flow.port !== '') {
      const n = Number(flow.port);
      if (!Number.isInteger(n) || n < 1 || n > 65535) throw new Error(`port "${flow.port}": 1-65535`);
      if (!flow.proto) throw new Error('a port needs its protocol (proto=TCP, UDP or ICMP)');
    }
  } catch (err) {
    flow.error = err;
  }
  return flow;
}

function flowForm(flow, ctx) {
  const mesh = h('input', { id: 'mesh', name: 'mesh', value: flow.mesh, placeholder: 'default', autocomplete: 'off' });
  const type = h('input', { id: 'type', name: 'type', value: flow.type, placeholder: 'TrafficPermission', autocomplete: 'off' });
  const endInputs = {};
  const endFields = ['src', 'dst'].map((end) => {
    const name = end === 'src' ? 'Source' : 'Destination';
    const sel = h('select', { id: `${end}-form`, name: `${end}-form` },
      forms.map((f) => h('option', { value: f.form, selected: f.form === flow[end].form }, f.label)));
    const input = h('input', {
      id: `${end}-value`, name: end, value: flow[end].value, class: 'wide', autocomplete: 'off',
      placeholder: forms.find((f) => f.form === flow[end].form).placeholder,
    });
    sel.addEventListener('change', () => { input.placeholder = forms.find((f) => f.form === sel.value).placeholder; });
    endInputs[end] = { sel, input };
    return h('fieldset', null, h('legend', null, name),
      field(`${name} given as`, sel), field(`${name} value`, input));
  });
  const proto = h('select', { id: 'proto', name: 'proto' },
    protocols.map((p) => h('option', { value: p, selected: p === flow.proto }, p || 'any')));
  const port = h('input', { id: 'port', name: 'port', type: 'number', min: 1, max: 65535, value: flow.port });
  return h('form', {
    class: 'query', 'aria-label': 'Flow', id: 'flow',
    onsubmit: (e) => {
      e.preventDefault();
      const p = new URLSearchParams();
      p.set('mesh', mesh.value.trim());
      p.set('type', type.value.trim());
      for (const end of ['src', 'dst']) {
        p.set(end, formatEnd({ form: endInputs[end].sel.value, value: endInputs[end].input.value.trim() }));
      }
      p.set('proto', proto.value);
      p.set('port', port.value.trim());
      p.set('rev', flow.rev);
      ctx.navigate(p, { focus: true });
    },
  },
  field('Mesh', mesh), field('Type', type), endFields, field('Protocol', proto), field('Port', port),
  h('button', { type: 'submit', class: 'primary', id: 'decide-submit' }, 'Decide'));
}

// decision renders the answer: the verdict, both sides, the ends, the trace.
function decision(flow, r) {
  const act = enumText(r.action, 'ACTION_');
  const out = [
    h('h2', { id: 'result-title', tabindex: '-1' },
      h('span', { id: 'verdict-action', class: `verdict ${act.toLowerCase()}` }, act),
      r.policy ? [' by policy ', h('code', { id: 'verdict-policy' }, r.policy)] : ' (no policy decided)'),
    h('p', { class: 'meta' }, `mesh ${flow.mesh || 'default'} · ${flow.type || 'TrafficPermission'} · `,
      flow.proto ? `${flow.proto}${flow.port ? `/${flow.port}` : ''}` : 'any protocol', ` · revision ${r.revision || '0'}`,
      flow.rev ? ' (the store as it was)' : ''),
    table('Both sides', ['Side', 'Action', 'Reason', 'Policy', 'Scope', 'Rule'],
      [['outbound', r.outbound], ['inbound', r.inbound]].map(([name, s]) => [
        name, action(s?.action), enumText(s?.reason, 'REASON_'), dash(s?.policy), dash(s?.scope), dash(s?.rule)]),
      { id: 'sides' }),
    ends(flow, r),
  ];
  if (r.audit) {
    out.push(h('p', { id: 'audit' }, h('span', { class: 'audit' }, 'audit'),
      ` with audit rules enforced it would be ${enumText(r.audit.action, 'ACTION_')} by policy ${dash(r.audit.policy)}`,
      ` (${dash(r.audit.side)} side, rule ${dash(r.audit.rule)})`));
  }
  if (r.conf && Object.keys(r.conf).length) {
    out.push(h('h3', null, 'Configuration of the deciding rule'), h('pre', { class: 'mono', id: 'conf' }, JSON.stringify(r.conf, null, 2)));
  }
  out.push(r.explanation ? traces(flow, r)
    : h('div', { id: 'trace', 'aria-busy': 'true' }, h('p', { class: 'hint' }, 'Explaining: the candidate rules of both sides…')));
  return out;
}

function ends(flow, r) {
  return h('dl', { class: 'facts', id: 'ends' },
    h('dt', null, 'Source'), h('dd', null, resolution(flow.src, r.sourceResolution, flow)),
    h('dt', null, 'Destination'), h('dd', null, resolution(flow.dst, r.destinationResolution, flow)));
}

function traces(flow, r) {
  const ex = r.explanation || {};
  return h('div', { class: 'sides', id: 'trace' },
    trace('outbound', 'source', flow.src, ex.outbound),
    trace('inbound', 'destination', flow.dst, ex.inbound));
}

// resolution says how an end resolved, with a link to its workload's page.
function resolution(given, res, flow) {
  if (!res) return formatEnd(given);
  const form = enumText(res.form, 'ENDPOINT_FORM_').toLowerCase();
  const as = enumText(res.resolvedAs, 'RESOLVED_AS_').toLowerCase().replaceAll('_', ' ');
  const notes = [];
  if (res.holders) notes.push(`${res.holders} holder${res.holders === 1 ? '' : 's'}`);
  if (res.identity) notes.push(`identity ${res.identity}`);
  const link = res.workload ? h('a', {
    href: query([['view', 'workload'], ['mesh', flow.mesh || 'default'], ['workload', res.workload], ['type', flow.type]]),
  }, res.workload) : null;
  return h('span', null, `${form} → ${as}`, link ? [' ', link] : null,
    notes.length ? ` (${notes.join(', ')})` : '', res.tags ? [': ', h('code', null, tagsText(res.tags))] : null);
}

// trace is one side's explanation: member scopes, candidates in order, and
// the policies that were not candidates.
function trace(side, end, given, t) {
  t = t || {};
  const rows = (t.candidates || []).map((c, i) => {
    let res = `no match: ${dash(c.why)}`;
    if (c.decided) res = 'MATCHED, DECIDED';
    else if (c.matched) res = `matched: ${dash(c.why)}`;
    return {
      class: c.decided ? 'decided' : c.matched ? null : 'nomatch',
      cells: [String(i + 1), dash(c.phase), dash(c.scope), dash(c.policy), h('code', null, dash(c.rule)), dash(c.rank),
        String(c.priority || 0), action(c.action, c.audit), res],
    };
  });
  return h('section', { id: `trace-${side}`, 'aria-labelledby': `trace-${side}-title` },
    h('h3', { id: `trace-${side}-title` }, `${side[0].toUpperCase()}${side.slice(1)} side (at the ${end}, ${formatEnd(given)}): `,
      enumText(t.reason, 'REASON_')),
    t.members?.length ? h('p', null, `Member scopes: ${t.members.join(', ')} (most specific: ${dash(t.mostSpecificScope)})`) : null,
    rows.length
      ? table(`Candidate rules of the ${side} side, in order`,
        ['#', 'Phase', 'Scope', 'Policy', 'Rule', 'Rank', 'Prio', 'Action', 'Result'], rows, { class: 'candidates' })
      : h('p', null, 'No candidate rule.'),
    t.notCandidates?.length ? [h('h4', null, 'Not candidates'),
      h('ul', { class: 'not-candidates' }, t.notCandidates.map((n) => h('li', null, h('code', null, n.policy), `: ${n.why}`)))] : null,
    t.truncated ? h('p', { class: 'hint' }, 'The lists were cut at 1000 entries.') : null);
}
