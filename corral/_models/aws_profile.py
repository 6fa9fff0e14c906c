"""The AWS shared files' profile: keys and region, read as the AWS command line reads them.

obstore (the ``s3`` extra) finds credentials in ``AWS_*`` variables, a web identity token,
a container's or the instance's metadata, but never in the shared files the AWS command line
writes (``aws configure``): ``~/.aws/credentials`` and ``~/.aws/config``. A Triton user's
profile lives there, so :func:`profile_settings` reads them, in the AWS chain's order:

- keys in the environment (``AWS_ACCESS_KEY_ID``), or a web identity (``AWS_ROLE_ARN`` with
  ``AWS_WEB_IDENTITY_TOKEN_FILE``), come first: then no key is taken from the files;
- the profile is ``AWS_PROFILE``, else ``default``; its keys come from the credentials file
  (``AWS_SHARED_CREDENTIALS_FILE``, else ``~/.aws/credentials``, section ``[name]``), else from
  the config file (``AWS_CONFIG_FILE``, else ``~/.aws/config``, section ``[profile name]``, or
  ``[default]``); a container's or the instance's metadata come after them (obstore's);
- the region is ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, else the profile's ``region``.

Only static keys are read (``aws_access_key_id``, ``aws_secret_access_key``,
``aws_session_token``): a profile that assumes a role, runs a ``credential_process`` or signs
in through SSO needs botocore, which corral does not depend on; it is named in a warning and
the rest of the chain is tried. A profile that ``AWS_PROFILE`` names and neither file holds,
or one with a key and no secret, is a :class:`RepositoryError` naming the profile and the file
(never a key).
"""

from __future__ import annotations

import configparser
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from corral._base import RepositoryError

__all__ = ["ProfileSettings", "profile_settings"]

logger = logging.getLogger(__name__)

#: What a profile may say that needs more than its static keys (botocore's providers).
_NOT_FOLLOWED = (
    "role_arn",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "web_identity_token_file",
)


@dataclass(frozen=True)
class ProfileSettings:
    """What the shared files add to obstore's own chain for one S3 store.

    Each field is None where the environment (or nothing) gives it instead.
    """

    #: The profile read (``AWS_PROFILE``, else ``default``).
    profile: str
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    #: The file the keys came from, for messages; None when no key came from a file.
    source: str | None = None

    def config(self) -> dict[str, str]:
        """The settings found, by the names obstore's ``S3Store(config=...)`` gives them.

        Each one overrides obstore's own reading of the environment: only those the
        environment lacks are set.
        """
        found = {
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "session_token": self.session_token,
            "region": self.region,
        }
        return {key: value for key, value in found.items() if value}


def profile_settings(environ: Mapping[str, str] | None = None) -> ProfileSettings:
    """The keys and region the shared files give, where ``environ`` does not.

    ``environ`` is :data:`os.environ` when None. Raises :class:`RepositoryError` naming the
    profile when ``AWS_PROFILE`` names one neither file holds, or when a profile has a key
    and no secret.

    Example::

        S3Store("models", config=profile_settings().config())
    """
    env = os.environ if environ is None else environ
    named = env.get("AWS_PROFILE")
    profile = named or "default"
    home = os.path.expanduser("~")
    credentials_file = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(
        home, ".aws", "credentials"
    )
    config_file = env.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config")
    from_credentials = _section(credentials_file, profile)
    from_config = _section(
        config_file, profile if profile == "default" else f"profile {profile}"
    ) or (_section(config_file, "profile default") if profile == "default" else None)
    if named and from_credentials is None and from_config is None:
        raise RepositoryError(
            f"the AWS profile {profile!r} (AWS_PROFILE) is in neither {credentials_file} nor "
            f"{config_file} (as [profile {profile}]): add it, or unset AWS_PROFILE"
        )
    region = None
    if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        region = (from_config or {}).get("region") or (from_credentials or {}).get("region")
    keys_in_environment = bool(env.get("AWS_ACCESS_KEY_ID")) or bool(
        env.get("AWS_ROLE_ARN") and env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
    )
    if keys_in_environment:
        return ProfileSettings(profile, region=region or None)
    for path, section in ((credentials_file, from_credentials), (config_file, from_config)):
        if section is None:
            continue
        key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
        if key and not secret:
            raise RepositoryError(
                f"the AWS profile {profile!r} in {path} has aws_access_key_id but no "
                "aws_secret_access_key: add it"
            )
        if key and secret:
            return ProfileSettings(
                profile,
                access_key_id=key,
                secret_access_key=secret,
                session_token=section.get("aws_session_token") or None,
                region=region or None,
                source=path,
            )
    for path, section in ((credentials_file, from_credentials), (config_file, from_config)):
        followed = [key for key in _NOT_FOLLOWED if section and section.get(key)]
        if followed:
            logger.warning(
                "corral: the AWS profile %r in %s has %s but no static keys: corral reads only "
                "aws_access_key_id and aws_secret_access_key from a profile (the rest needs "
                "botocore); credentials are looked for in a container's or the instance's "
                "metadata instead",
                profile,
                path,
                ", ".join(followed),
            )
    return ProfileSettings(profile, region=region or None)


def _section(path: str, name: str) -> dict[str, str] | None:
    """Section ``name`` of the INI file at ``path``; None if the file or the section is missing.

    Raises :class:`RepositoryError` naming the file when it cannot be parsed.
    """
    parser = configparser.RawConfigParser(default_section="\0none")
    try:
        with open(path, encoding="utf-8") as file:
            parser.read_file(file)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        # The parser's words quote the line at fault, which may hold a key: only the file is named.
        raise RepositoryError(
            f"the AWS shared file {path} cannot be read as an INI file ({type(exc).__name__})"
        ) from None
    if not parser.has_section(name):
        return None
    return {key: value.strip() for key, value in parser.items(name)}
