# The part of an overrun the account could not pay: recorded, never overdrawn.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0003_publicmodel_to_catalog'),
    ]

    operations = [
        migrations.AlterField(
            model_name='usagerecord',
            name='overrun',
            field=models.BigIntegerField(default=0, help_text='micro-credits the usage cost beyond the reservation'),
        ),
        migrations.AddField(
            model_name='usagerecord',
            name='uncharged',
            field=models.BigIntegerField(db_default=0, default=0, help_text="micro-credits of the usage's cost the account could not pay (never overdrawn)"),
        ),
    ]
