"""``crawlq dashboard``: a web dashboard over the queue, for operators.

=================  ===================================================================
``command.py``     the subcommand: options, bind checks, serve until a signal
``app.py``         the aiohttp application: pages, ``/static``, the API, the actions
``security.py``    the security model: token, same-origin, Host check, headers, errors
``api.py``         ``GET /api/...``: one JSON view per panel of the pages
``actions.py``     ``POST /api/...``: pause, resume, host settings and blocks, requeue
                   and purge dead letters
``policy.py``      ``/api/crawls/{crawl}/policy``: the crawl's policy, read and set (a
                   version check against the form's, logged ``by: dashboard``)
``static/``        plain HTML, CSS and JavaScript (no build step, no CDN)
=================  ===================================================================

Every read and write goes through the ``common`` modules that own the data
(``crawls``, ``workers``, ``history``, ``deadletters``, ``frontier``, ``queue``,
``policy``).
"""
