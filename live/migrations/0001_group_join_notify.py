"""A socket joining a live group NOTIFYs the publishers (live.events.LISTENERS_CHANNEL), which
then forget which groups they last saw with members and send to the new one too."""

from django.db import migrations

CREATE = """
    CREATE FUNCTION gpuplatform_live_group_joined() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('gpuplatform_live_groups', '');
        RETURN NULL;
    END $$;
    CREATE TRIGGER gpuplatform_live_group_joined
        AFTER INSERT ON channels_postgres_groupchannel
        FOR EACH STATEMENT EXECUTE FUNCTION gpuplatform_live_group_joined();
"""
DROP = """
    DROP TRIGGER gpuplatform_live_group_joined ON channels_postgres_groupchannel;
    DROP FUNCTION gpuplatform_live_group_joined();
"""


class Migration(migrations.Migration):
    dependencies = [("channels_postgres", "0004_notify_ensure_payload_not_too_big")]

    operations = [migrations.RunSQL(CREATE, DROP)]
