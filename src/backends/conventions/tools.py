def _execbox_tools(names, exchange, _kept={}):
    import itertools, json, sys
    dumps, module = json.dumps, type(sys)
    if not _kept:
        class ToolError(Exception):
            '''A tool call that produced no value: .tool, .kind ('not_granted', 'failed', 'timed_out', ...), .message.'''
            def __init__(self, tool, kind, message):
                Exception.__init__(self, '%s: %s (%s)' % (tool, kind, message))
                self.tool, self.kind, self.message = tool, kind, message
        ToolError.__module__ = 'tools'
        tools = module('tools', 'The host tools this run may call: tools.<namespace>.<tool>(**args), '
                       'tools.call(name, args), tools.list(), tools.describe(name); failures raise tools.ToolError.')
        tools.__path__ = []
        _kept.update(ToolError=ToolError, tools=tools, ids=itertools.count(1))
    ToolError, tools, ids = _kept['ToolError'], _kept['tools'], _kept['ids']
    def call(name, args=None):
        '''Calls the tool `name` ('namespace.tool') with `args` (a dict); returns its value or raises tools.ToolError.'''
        if not isinstance(name, str):
            raise ToolError(repr(name), 'not_found', 'a tool name is a string')
        if args is None:
            args = {}
        id = next(ids)
        try:
            frame = dumps({'tool_call': {'id': id, 'name': name, 'args': args}}, ensure_ascii=False,
                          allow_nan=False, separators=(',', ':')).encode()
        except (TypeError, ValueError) as e:
            raise ToolError(name, 'invalid_arguments', 'the arguments are not JSON: %s' % e) from None
        result = exchange(id, frame)
        if result is None:
            raise ToolError(name, 'cancelled', 'no answer: the run is over')
        if result.get('ok'):
            return result.get('value')
        error = result.get('error') or {}
        raise ToolError(error.get('tool', name), error.get('kind', 'protocol'), error.get('message', ''))
    def list_tools():
        '''The names of the tools this run may call.'''
        return call('tools.list', {})
    def describe(name):
        '''The spec of the tool `name`: description, input_schema, ...'''
        return call('tools.describe', {'name': name})
    def bind(full):
        def tool(args=None, /, **kwargs):
            return call(full, kwargs if args is None else dict(args, **kwargs))
        tool.__name__ = tool.__qualname__ = full.partition('.')[2]
        tool.__doc__ = 'Calls the tool %r: returns its value or raises tools.ToolError.' % full
        return tool
    for key, value in list(vars(tools).items()):
        if isinstance(value, module) and value.__name__ == 'tools.' + key:
            delattr(tools, key)
    tools.ToolError, tools.call, tools.list, tools.describe = ToolError, call, list_tools, describe
    for full in names:
        ns, _, short = full.partition('.')
        space = sys.modules.get('tools.' + ns)
        if space is None:
            space = sys.modules['tools.' + ns] = module('tools.' + ns)
            space.__package__ = 'tools'
            if not hasattr(tools, ns):
                setattr(tools, ns, space)
        setattr(space, short, bind(full))
    sys.modules['tools'] = tools
def _execbox_take_tools(source, connect):
    import sys
    if 'tools' in sys.modules:
        for name in [n for n in sys.modules if n == 'tools' or n.startswith('tools.')]:
            del sys.modules[name]
    if not source.startswith('\0tools:'):
        return source
    import io, json
    header, _, source = source.partition('\n')
    spec = json.loads(header[7:])
    _execbox_tools(spec['names'], connect(spec))
    sys.stdin = io.StringIO('')
    return source
