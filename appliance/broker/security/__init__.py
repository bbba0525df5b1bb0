"""Who may connect and what they may touch: mosquitto-compatible password and ACL files.

``auth`` checks passwords (PBKDF2), ``login_gate`` admits those checks so that they cannot be turned into
a denial of service, ``acl`` authorizes each topic on publish, subscribe and delivery, ``passwd_cli`` is
``appliance passwd``.
"""
