from iniconf import get_profile, parse, profiles

CONFIG = """
[default]
region = us-east-1
output = json

[profile dev]
region = eu-central-1

[plugins]
endpoint = local
"""


def test_profiles_lists_default_and_named():
    assert sorted(profiles(parse(CONFIG))) == ["default", "dev"]


def test_get_profile_inherits_default():
    assert get_profile(parse(CONFIG), "dev") == {"region": "eu-central-1", "output": "json"}
