"""A Qwen-style ChatML test template (written for these tests).

It uses plain `{% %}` tags as well as `-` trimmed ones, so trim_blocks / lstrip_blocks matter, and
exercises namespace, loop controls, `tojson` with arguments, `raise_exception` and special-token
variables. Tool calls are rendered in the XML wire format of product spec 7.2.
"""

QWEN_TEMPLATE = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('Unexpected content part type: ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is none or content is undefined -%}
    {%- else -%}
        {{- raise_exception('Unexpected content type') -}}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_query=-1) %}
{%- for message in messages | reverse %}
    {%- set index = (messages | length) - 1 - loop.index0 %}
    {%- set text = render_content(message.content) %}
    {%- if message.role == 'user' and not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
        {%- set ns.last_query = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- if ns.last_query < 0 %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- if tools %}
<|im_start|>system
# Tools

You have access to the following functions:

<tools>
    {% for tool in tools %}
{{ (tool.function if tool.function is defined else tool) | tojson }}
    {% endfor %}
</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
</function>
</tool_call>
End the turn with {{ eos_token }} when done.
    {% if messages[0].role == 'system' %}

{{ render_content(messages[0].content) | trim }}
    {% endif %}
<|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ render_content(messages[0].content) | trim }}<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content) | trim %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
        {%- continue %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- set reasoning = reasoning.strip('\\n') %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if loop.index0 > ns.last_query and reasoning %}
            {{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
                {%- if loop.first and content or not loop.first %}
                    {{- '\\n\\n' if loop.first else '\\n' }}
                {%- endif %}
                {{- '<tool_call>\\n<function=' + call.name + '>\\n' }}
                {%- for name, value in call.arguments | items %}
                    {{- '<parameter=' + name + '>\\n' }}
                    {%- if value is string %}
                        {{- value }}
                    {%- else %}
                        {{- value | tojson(separators=(',', ':')) }}
                    {%- endif %}
                    {{- '\\n</parameter>\\n' }}
                {%- endfor %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""
