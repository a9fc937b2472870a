"""One attempt of a request to a store, as `_storage/remote.py` makes it: a ranged GET that returns only
bytes of the version indexed, and HTTP's HEAD. Coroutines, run on the filesystem's event loop
(`_storage/remote.py` bounds each with the request's deadline).

NOTE [conditional reads]: an object is indexed at one version (its ETag: `remote.size_of`), and
its chunks are cached under it (NOTE [node cache]). Every GET of its bytes names that version:
S3's `IfMatch` (a 412 if the object was rewritten since), HTTP's `If-Match` (for a strong ETag;
a weak one cannot be matched so), and the answer's own ETag (or Last-Modified, for an HTTP
object that has no ETag) is compared with it as well, for a store that ignores the condition.
A difference is `SourceChanged`, never retried: the index's offsets and labels are the old
object's, so its new bytes must not be decoded under them. gs:// reads are not conditional
(gcsfs's `cat_file`; not covered).

NOTE [same-origin redirects]: HTTP requests never follow a redirect to another origin (scheme,
host and port): the loader would send its next request, and whatever headers a session adds, to
a host the dataset's URL does not name, and read what it answers. A redirect within the origin
is followed (at most `MAX_REDIRECTS`); one elsewhere fails the read, naming where it pointed.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from fastload._errors import SourceChanged

MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Refused(OSError):
    """The store's answer cannot be used, and asking again will not mend it (a redirect to
    another host, an object without byte ranges): failed at once, not retried."""


def is_etag(version: str) -> bool:
    """Whether a version (`remote.size_of`'s) is an entity tag (`"..."` or `W/"..."`) rather
    than a modification time."""
    return version.startswith(('"', 'W/"')) and version.endswith('"')


def etag(value: object) -> str:
    """An ETag as a version: quoted, as HTTP writes it (some stores' listings drop the quotes)."""
    text = str(value).strip()
    return text if is_etag(text) else f'"{text}"'


def _opaque(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def changed(url: str, how: str) -> SourceChanged:
    return SourceChanged(
        f"{url} changed since it was opened ({how}): the samples indexed in it are not its new "
        "content's, so it is not read; make the loader again (re-open the source) to index it as "
        "it is now, or pack the dataset again"
    )


def check_version(url: str, version: str, got_etag: str | None, got_modified: str | None) -> None:
    """SourceChanged when an answer's ETag (or Last-Modified) says it is not of `version`."""
    if not version:
        return
    if is_etag(version):
        if got_etag and _opaque(etag(got_etag)) != _opaque(version):
            raise changed(url, "its ETag differs from the one indexed")
    elif got_modified and got_modified.strip() != version:
        raise changed(url, "its Last-Modified differs from the one indexed")


def _precondition_failed(e: BaseException) -> bool:
    """Whether an s3fs error is S3's 412 (s3fs makes it an OSError whose cause is botocore's)."""
    for error in (e, e.__cause__):
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
    return False


async def s3_get(fs: Any, url: str, start: int, end: int, version: str) -> bytes:
    """Bytes [start, end) of an S3 object, only of `version` (NOTE [conditional reads])."""
    bucket, key, version_id = fs.split_path(url)
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
    if version_id:
        params["VersionId"] = version_id
    if is_etag(version) and not version.startswith("W/"):
        params["IfMatch"] = version
    try:
        answer = await fs._call_s3("get_object", **params)
    except OSError as e:
        if _precondition_failed(e):
            raise changed(url, "the store refused the read's If-Match: its ETag is another") from None
        raise
    body = answer["Body"]
    try:
        check_version(url, version, answer.get("ETag"), None)
        data: bytes = await body.read()
    finally:
        body.close()
    return data


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


async def _request(fs: Any, method: str, url: str, headers: dict[str, str]) -> Any:
    """The response to `method url`, redirects followed only within its origin (NOTE
    [same-origin redirects]); the caller closes it."""
    session = await fs.set_session()
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        address = fs.encode_url(target)
        response = await session.request(method, address, headers=headers, allow_redirects=False)
        if response.status not in _REDIRECTS:
            return response
        location = response.headers.get("Location", "")
        response.release()
        following = urllib.parse.urljoin(target, location)
        if not location or _origin(following) != _origin(url):
            scheme, host, port = _origin(following)
            raise Refused(
                f"{url}: the server redirects ({response.status}) to another host "
                f"({scheme}://{host}:{port}); fastload follows redirects within the URL's own host only: "
                "use the final URL if it is trusted"
            )
        target = following
    raise Refused(f"{url}: more than {MAX_REDIRECTS} redirects")


def _raise_for_status(url: str, response: Any) -> None:
    if response.status == 404:
        raise FileNotFoundError(url)
    if response.status in (401, 403):
        raise PermissionError(url)
    response.raise_for_status()  # other 4xx: refused at once (`remote._refused`); 5xx: retried


async def _body(response: Any, length: int) -> bytes:
    """At most `length` bytes of the body (a server that ignored the range sends more)."""
    parts, got = [], 0
    while got < length:
        piece = await response.content.read(length - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


async def http_get(fs: Any, url: str, start: int, end: int, version: str) -> bytes:
    """Bytes [start, end) of an HTTP(S) object, only of `version` (NOTE [conditional reads])."""
    headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    if is_etag(version) and not version.startswith("W/"):
        headers["If-Match"] = version
    response = await _request(fs, "GET", url, headers)
    async with response:
        if response.status == 412:
            raise changed(url, "the server refused the read's If-Match: its ETag is another")
        _raise_for_status(url, response)
        check_version(url, version, response.headers.get("ETag"), response.headers.get("Last-Modified"))
        if response.status == 206:
            wanted = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
            if wanted is None or int(wanted.group(1)) != start:
                raise Refused(f"{url}: asked for bytes {start}..{end}, the server sent another range")
        elif start != 0:  # a 200 is the whole object: usable from its start only
            raise Refused(f"{url}: the server does not answer byte ranges (a 200 to a Range request)")
        return await _body(response, end - start)


async def http_head(fs: Any, url: str) -> dict[str, Any]:
    """{"size", "ETag", "Last-Modified"} of an HTTP(S) object, from a HEAD (or, from a server
    that answers HEAD without a plain size, a GET of its first byte)."""
    headers = {"Accept-Encoding": "identity"}
    response = await _request(fs, "HEAD", url, headers)
    async with response:
        if response.status not in (405, 501):  # HEAD not allowed: ask with a GET
            _raise_for_status(url, response)
            length = response.headers.get("Content-Length")
            if length is not None and response.headers.get("Content-Encoding", "identity") == "identity":
                return {"size": int(length), **_versions(response)}
    response = await _request(fs, "GET", url, {**headers, "Range": "bytes=0-0"})
    async with response:
        _raise_for_status(url, response)
        wanted = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if response.status != 206 or wanted is None or wanted.group(3) == "*":
            raise Refused(f"{url}: the server says neither its size nor answers byte ranges")
        return {"size": int(wanted.group(3)), **_versions(response)}


def _versions(response: Any) -> dict[str, str]:
    return {k: response.headers[k] for k in ("ETag", "Last-Modified") if k in response.headers}
