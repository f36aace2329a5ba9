#
# pdu.py - snmpsim variation module for package snmpsim: the outlets of a
# switched PDU.
#
# Every record using it names one outlet (dev=NAME,outlet=N). All records of
# one outlet share one state, kept in its own JSON file STATEDIR/NAME_N.json,
# so a SET on a control OID changes what the status OIDs of that outlet
# return, and a test may edit one outlet while another is being switched.
#
# Record value: comma-separated key=value pairs
#   dev=NAME,outlet=N      the outlet (required)
#   read=on:1|off:2        GET value per state; optional pendingon:/pendingoff:
#                          keys are used while an on/off is scheduled
#   pend=Y:N               GET gives Y while a command is pending, else N
#   write=1:on|2:off|...   SET value -> action (on, off, reboot, cancel, noop);
#                          "@S" delays it S seconds; other values: wrongValue.
#                          No write= and no cmd=: notWritable
#   cmd=on|off|reboot      Eaton style: SET -1 cancels, 0 acts now, S>0 acts
#                          in S seconds; GET gives seconds left or -1
#   idle=V                 GET value of a write-only command OID
#   ro=1                   read-only community: SET -> noAccess
#
# Module options: statedir=PATH (required), reboot=S (reboot off-time, 5).
#
# Outlet state file keys (tests write them; write a temp file, rename it):
#   "state": "on"|"off"  missing file or key: the simulator's default, on
#   "stuck": true        SETs succeed but change nothing
#   "error": "commitFailed"  SETs fail with that error (noAccess, wrongValue,
#                        resourceUnavailable, inconsistentValue, ...)
#   "drop": true         no answer to any request touching the outlet
#   "flap": true         state GETs alternate on, off, on, ... whatever the
#                        state; SETs are accepted and change nothing
#   "pending"            scheduled changes (delayed commands, reboots)
#
import json
import os
import time

from pysnmp.smi import error
from snmpsim.grammar.snmprec import SnmprecGrammar
from snmpsim.record.snmprec import SnmprecRecord
from snmpsim.error import NoDataNotification
from snmpsim import log

ERRORS = {
    'noaccess': error.NoAccessError,
    'wrongtype': error.WrongTypeError,
    'wrongvalue': error.WrongValueError,
    'nocreation': error.NoCreationError,
    'inconsistentvalue': error.InconsistentValueError,
    'resourceunavailable': error.ResourceUnavailableError,
    'commitfailed': error.CommitFailedError,
    'notwritable': error.NotWritableError,
    'authorizationerror': error.AuthorizationError,
}


def init(**context):
    opts = {'statedir': '', 'reboot': '5'}
    for kv in (context.get('options') or '').split(','):
        if '=' in kv:
            k, v = kv.split('=', 1)
            opts[k.strip()] = v.strip()
    moduleContext['opts'] = opts


def _path(s):
    return os.path.join(moduleContext['opts']['statedir'],
                        '%s_%s.json' % (s['dev'], s['outlet']))


def _load(s):
    try:
        with open(_path(s)) as f:
            e = json.load(f)
    except (IOError, OSError, ValueError):
        e = {}
    e.setdefault('state', 'on')
    now = time.time()
    p = e.get('pending')
    while p and now >= p['at']:       # apply due scheduled changes lazily
        e['state'] = p['to']
        p = e['pending'] = p.get('then')
    return e


def _save(s, e):
    path = _path(s)
    tmp = '%s.%d.tmp' % (path, os.getpid())
    with open(tmp, 'w') as f:
        json.dump(e, f, indent=1, sort_keys=True)
    os.rename(tmp, path)


def _settings(value):
    s = {}
    for kv in value.split(','):
        k, _, v = kv.partition('=')
        s[k.strip()] = v.strip()
    for k in ('read', 'write', 'pend'):
        m = {}
        for item in (x for x in s.get(k, '').split('|') if x):
            a, _, b = item.partition(':')
            m[a] = b
        s[k] = m
    return s


def _act(e, action, delay, reboot_s):
    now = time.time()
    if action == 'noop':
        return
    if action == 'cancel':
        e['pending'] = None
        return
    if action == 'reboot':
        if delay > 0:
            e['pending'] = {'kind': 'reboot', 'to': 'off', 'at': now + delay,
                            'then': {'kind': 'reboot', 'to': 'on',
                                     'at': now + delay + reboot_s}}
        else:
            e['state'] = 'off'
            e['pending'] = {'kind': 'reboot', 'to': 'on', 'at': now + reboot_s}
        return
    if delay > 0:
        e['pending'] = {'kind': action, 'to': action, 'at': now + delay}
    else:
        e['state'] = action
        e['pending'] = None


def variate(oid, tag, value, **context):
    if not context['nextFlag'] and not context['exactMatch']:
        return context['origOid'], tag, context['errorStatus']

    if 'settings' not in recordContext:
        recordContext['settings'] = _settings(value)
    s = recordContext['settings']

    type_tag, _ = SnmprecRecord.unpackTag(tag)
    proto = SnmprecGrammar.tagMap[type_tag]
    idx = max(0, context['varsTotal'] - context['varsRemaining'] - 1)
    reboot_s = float(s.get('reboot') or moduleContext['opts']['reboot'])

    e = _load(s)
    key = '%s/%s' % (s['dev'], s['outlet'])
    if e.get('drop'):
        raise NoDataNotification()

    if context['setFlag']:
        if s.get('ro'):
            raise error.NoAccessError(name=oid, idx=idx)
        if not s['write'] and not s.get('cmd'):
            raise error.NotWritableError(name=oid, idx=idx)
        new = context['origValue']
        if new.tagSet != proto.tagSet:
            raise error.WrongTypeError(name=oid, idx=idx)
        if e.get('error'):
            raise ERRORS.get(str(e['error']).lower(), error.CommitFailedError)(name=oid, idx=idx)
        if s.get('cmd'):
            n = int(new)
            if n < -1:
                raise error.WrongValueError(name=oid, idx=idx)
            if n == -1:
                p = e.get('pending')
                action, delay = ('cancel' if p and p.get('kind') == s['cmd'] else 'noop'), 0
            else:
                action, delay = s['cmd'], n
        else:
            a = s['write'].get(str(new))
            if a is None:
                raise error.WrongValueError(name=oid, idx=idx)
            action, _, d = a.partition('@')
            delay = float(d or 0)
        ignored = e.get('stuck') or e.get('flap')
        log.msg('pdu: SET %s = %s on %s -> %s%s%s' % (
            oid, new, key, action, delay and ' in %ss' % delay or '',
            ignored and ' (ignored: fault hook)' or ''))
        if not ignored:
            _act(e, action, delay, reboot_s)
        _save(s, e)
        return oid, tag, new

    p = e.get('pending')
    if s.get('cmd'):
        v = max(0, int(round(p['at'] - time.time()))) if p and p.get('kind') == s['cmd'] else -1
    elif s['pend']:
        v = list(s['pend'].keys())[0] if p else list(s['pend'].values())[0]
    elif s['read']:
        state = e['state']
        if e.get('flap'):
            n = int(e.get('flaps', 0))
            state = 'on' if n % 2 == 0 else 'off'
            e['flaps'] = n + 1
            _save(s, e)
            p = None
        v = s['read'].get('pending' + p['to']) if p else None
        if v is None:
            v = s['read'].get(state)
        if v is None:
            return context['origOid'], tag, context['errorStatus']
    else:
        v = s.get('idle', '0')
    return oid, tag, proto(v)


def shutdown(**context):
    pass
